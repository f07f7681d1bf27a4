"""`draftverify serve`: an OpenAI-compatible HTTP server over the library's decoding loop.

app.create_app(pipe, ServerSettings(...)) builds the FastAPI app; engine.Engine runs generation (batched,
continuous) in one worker thread; ray_serve runs the same app on Ray Serve replicas. Needs the `serve` extra.
"""
