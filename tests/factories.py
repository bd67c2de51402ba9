"""Targets for ``fuseg ... package.module:factory`` in the CLI tests."""

import torch


def pointwise():
    return (lambda x: (x * 2).sin(), [torch.randn(4, 4)])


def not_a_pair():
    return 42
