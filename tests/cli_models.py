"""Targets for the CLI tests (imported as MODULE:NAME)."""

import functools

from small_models import SlimNetShim

broken_epsilon = functools.partial(SlimNetShim, bn_epsilon=0.5)
