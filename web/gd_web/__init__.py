"""gd-web: a web dashboard for gen_durable (see web/README.md)."""

from .app import create_app

__all__ = ["create_app"]
