"""`draftverify serve --ray`: the same OpenAI-compatible app on Ray Serve, R replicas behind Ray's HTTP proxy.

Each replica loads its own copy of the models and runs its own generation worker, queue and batch (the app of
create_app, built on the replica by serve.ingress's builder); Ray's proxy spreads requests over the replicas.
/metrics and /health answer for the replica that serves the request. Needs the optional extra:
pip install 'draftverify[ray]'.
"""

from __future__ import annotations

from ..errors import DraftVerifyError


def build_deployment(load_args: dict, settings, replicas: int = 1, threads: int | None = None):
    """A bound Ray Serve application of `replicas` replicas of the server."""
    try:
        from ray import serve
    except ImportError:
        raise DraftVerifyError("--ray needs Ray Serve: pip install 'draftverify[ray]'") from None

    def build_app():  # runs on each replica: its own models, worker and queue
        import torch

        from ..api import load
        from .app import create_app

        if threads is not None:
            torch.set_num_threads(threads)
        return create_app(load(**load_args), settings)

    @serve.deployment(
        name="draftverify",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": threads or 1},
        max_ongoing_requests=settings.max_queue + settings.max_batch,
    )
    @serve.ingress(build_app)
    class DraftVerifyReplica:
        pass

    return DraftVerifyReplica.bind()


def run_ray(
    load_args: dict, settings, replicas: int = 1, host: str = "127.0.0.1", port: int = 8000, threads: int | None = None
) -> None:
    """Start Ray (a local instance unless RAY_ADDRESS names a cluster), deploy, and block until interrupted."""
    import time

    try:
        import ray
        from ray import serve
    except ImportError:
        raise DraftVerifyError("--ray needs Ray Serve: pip install 'draftverify[ray]'") from None
    application = build_deployment(load_args, settings, replicas, threads)
    ray.init(ignore_reinit_error=True, include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(application, name="draftverify", route_prefix="/")
    print(f"serving {settings.model_name} on Ray Serve ({replicas} replicas) at http://{host}:{port}/v1", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
