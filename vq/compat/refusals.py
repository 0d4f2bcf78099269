"""The anchor's arguments that vq cannot honour, and the checks that refuse them.

Arguments vq honours are explicit keyword arguments of each compat class; every other argument
of vector-quantize-pytorch's constructor sits in a table (:data:`Refused`) of its default and the
reason vq cannot take another value, beside the class it belongs to (``*_REFUSED``).
:func:`refuse` checks a call against it: the default passes (the feature stays off), any other
value raises a ValueError naming the argument, and a name the anchor does not have raises
TypeError, as Python would.
"""

from __future__ import annotations

from collections.abc import Mapping

#: argument → (vector-quantize-pytorch's default, why vq.compat takes no other value)
Refused = Mapping[str, tuple[object, str]]

#: reasons that several tables give
FLOAT32 = "vq quantizes in float32 whatever the input dtype"
FIXED_STAGES = "vq's residual stages are fixed by the residual layer"
#: ``quantize_dropout_multiple_of`` of the residual layers
DROPOUT_MULTIPLE = (1, "vq drops any number of stages, drawn per sample")


def is_default(value: object, default: object) -> bool:
    """Whether ``value`` is the anchor's ``default`` (a class stands for any instance of it)."""
    if isinstance(default, type):
        return isinstance(value, default)
    if default is None or isinstance(default, bool):
        return value is default or (default is not None and value == default)
    try:
        return bool(value == default)
    except (TypeError, RuntimeError):  # tensors, modules
        return False


def refuse(owner: str, given: Mapping[str, object], table: Refused) -> None:
    """Raise for every argument in ``given`` that ``table`` does not allow at its value.

    Raises:
        TypeError: a name the anchor's ``owner`` does not take.
        ValueError: a known argument at a value other than the anchor's default.
    """
    for name, value in given.items():
        if name not in table:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        default, reason = table[name]
        if not is_default(value, default):
            shown = f"{default.__name__}()" if isinstance(default, type) else repr(default)
            raise ValueError(
                f"{owner}: {name}={value!r} is not supported by vq.compat ({reason}); leave it "
                f"at vector-quantize-pytorch's default, {shown}"
            )


def refuse_call(owner: str, **given) -> None:
    """Forward arguments vq cannot honour: each must be None or False."""
    for name, value in given.items():
        if value is not None and value is not False:
            raise ValueError(f"{owner}: {name}={value!r} is not supported by vq.compat")


def check_sync(owner: str, sync_codebook: bool | None) -> None:
    """vq's layers synchronise their codebooks whenever a process group is initialised."""
    if sync_codebook is False:
        raise ValueError(
            f"{owner}: sync_codebook=False is not supported by vq.compat: vq's layers all-reduce "
            "their statistics over vq.parallel.current_group() whenever torch.distributed is "
            "initialised; wrap training in vq.distributed.use_group(None) to keep a layer local"
        )
