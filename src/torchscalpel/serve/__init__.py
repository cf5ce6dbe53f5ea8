"""Serve: a FastAPI app that answers predictions from a verified bundle, batching concurrent requests.

``scalpel serve BUNDLE`` verifies the bundle's hashes, loads one runner (onnxruntime by default),
builds the app with :func:`torchscalpel.serve.app.create_app` and runs it on uvicorn.
"""
