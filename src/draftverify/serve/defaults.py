"""The server's defaults, in a module that imports nothing, so the CLI's flags read them without loading FastAPI."""

MAX_QUEUE = 64  # requests that may wait for a row; more get 429 with Retry-After
STREAM_INTERVAL = 0.05  # seconds: a stream's text in chunks of up to 50 ms of decoding
MAX_STREAM_INTERVAL = 10.0
