"""Shared pytest setup: quiet TensorFlow, deterministic seeds."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
