"""The wire protocol, below both the server (env_server) and the SDK (clients): the code
generated from proto/visenv/v1 (`visenv.v1`), its Python types (`visenv.wire`), and the
response formats' layouts (`visenv.formats`)."""
