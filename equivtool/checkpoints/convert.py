"""TF1 name-based checkpoint -> TF2 object-based checkpoint: :func:`convert_checkpoint`.

The model's variables go through the mapping (``rename=`` rules or a
:class:`~equivtool.VariableMapping`); the TF1 optimizer's slots become the
tf-keras optimizer's (see ``equivtool.variables.slots`` for each layout and
what it preserves), and ``iterations`` is recovered from ``global_step`` or
Adam's beta powers, checked against each other. Every problem found is named
before anything is written (an output that is, or shares files with, the input
is refused, even with ``overwrite``).

Replacing a checkpoint is atomic as a whole: one rename decides. A reader
opens ``PREFIX.index`` and then the data files it names,
``PREFIX.data-<i>-of-<n>``, so the new checkpoint is written (into a hidden
staging folder beside the destination) with a shard count ``n`` that no data
file there has; its data files are moved in beside the old ones, then its
index is renamed over the old index, the commit point, and only then are the
old data files removed. At every instant the prefix reads as the complete old
checkpoint or the complete new one. Data files no index names (a run killed
between the two steps) and staging folders of killed runs are removed by the
next run; SIGTERM and Ctrl-C remove the staging folder on the way out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import re
import shutil
import tempfile
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from equivtool._base import scratch
from equivtool._base.errors import short
from equivtool.checkpoints import _keras_file, _paths
from equivtool.variables import slots as _slots
from equivtool.variables.mapping import (MappingRenamer, as_rename, check_inputs, fresh_layer_numbering,
                                           make_layer, native_rewrite_hint, renumbering_hint,
                                           tf2_value)
from equivtool.engine import signals as _signals
from equivtool.engine.sides.tf1_side import checkpoint_exists
from equivtool.variables import make_renamer
from equivtool.variables.flavour import is_keras3, layer_variables, variable_dtype, variable_name, variable_shape

__all__ = ["convert_checkpoint", "Conversion", "convert"]

#: How many problems a refusal lists (the count says how many there are).
_SHOWN = 20
#: Why slots were left out when no optimizer was given, and the option that converts them.
NO_OPTIMIZER = ("no optimizer given; pass optimizer= (CLI: --optimizer MODULE:FACTORY) to convert the slots, "
                "and slot_layout= (--slot-layout) for a layout equivtool does not know")


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What :func:`convert` wrote: ``(TF2 name, TF1 checkpoint key)`` per model
    variable, ``("<slot>/<TF2 name>", TF1 key, transform)`` per slot (the
    optimizer's own slot name: tf-keras ``m``, Keras 3 ``momentum``), the
    TF1 keys left out (with why), ``iterations``, and notes on the
    hyperparameters that differ between the two implementations."""

    path: str
    model: tuple
    slots: tuple = ()
    left_out: tuple = ()
    iterations: int | None = None
    optimizer: str = ""
    notes: tuple = ()

    def __str__(self) -> str:
        what = ".keras file" if self.path.endswith(".keras") else "TF2 checkpoint"
        lines = [f"{what} {self.path}: {len(self.model)} model variables, {len(self.slots)} slots"
                 + (f", iterations={self.iterations}" if self.iterations is not None else "")
                 + (f" ({self.optimizer})" if self.optimizer else "")]
        lines += [f"  {tf2} <- {tf1}" for tf2, tf1 in self.model]
        lines += [f"  {tf2} <- {tf1}" + ("" if how == "copy" else f" ({how})") for tf2, tf1, how in self.slots]
        lines += [f"  not converted: {key} ({why})" for key, why in self.left_out if why != NO_OPTIMIZER]
        unconverted = [key for key, why in self.left_out if why == NO_OPTIMIZER]
        if unconverted:  # one line: the same cause and the same fix for every slot
            lines.append(f"  not converted: {len(unconverted)} optimizer variables ({unconverted[0]}...): "
                         f"{NO_OPTIMIZER}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


class _Reader:
    """A checkpoint reader whose read errors (a data file missing, truncated, or
    failing its checksum) are one-line ``ValueError``s naming the key."""

    def __init__(self, reader, path: str):
        self._reader, self._path = reader, path

    def get_variable_to_shape_map(self):
        return self._reader.get_variable_to_shape_map()

    def get_variable_to_dtype_map(self):
        return self._reader.get_variable_to_dtype_map()

    def get_tensor(self, key: str) -> np.ndarray:
        try:
            return self._reader.get_tensor(key)
        except (tf.errors.OpError, ValueError, IndexError) as exc:  # IndexError: a data file cut short
            raise ValueError(f"tf1_checkpoint: {self._path!r}: {key!r} cannot be read (a data file missing, "
                             f"truncated or corrupt?): {short(exc)}") from None


def _scalar(name: str, value) -> np.ndarray:
    """A checkpoint scalar (global_step, a beta power), refused naming the key
    when it is a vector or not finite."""
    value = np.asarray(value)
    if value.size != 1 or value.ndim > 1:
        raise ValueError(f"tf1_checkpoint: {name} has shape {list(value.shape)}; expected a scalar")
    if value.dtype.kind in "fc" and not np.isfinite(value).all():
        raise ValueError(f"tf1_checkpoint: {name} = {value.reshape(()).item()}; expected a finite number")
    return value.reshape(())


def open_tf1_checkpoint(path: str) -> tuple:
    """``(reader, {key: shape}, {key: dtype})`` of the TF1 name-based checkpoint at
    ``path``, or ``ValueError`` (unreadable, or a TF2 object-based checkpoint)."""
    try:
        reader = _Reader(tf.train.load_checkpoint(path), path)
    except (tf.errors.OpError, ValueError) as exc:
        raise ValueError(f"tf1_checkpoint: {path!r} cannot be read: {short(exc)}") from None
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in shapes:
        raise ValueError(f"tf1_checkpoint: {path!r} is a TF2 object-based checkpoint; expected a TF1 "
                         "name-based one (tf.compat.v1.train.Saver)")
    return reader, shapes, dtypes


def checkpoint_path(value, argument: str = "tf1_checkpoint") -> str:
    """The checkpoint prefix ``value`` names (a folder: its latest checkpoint),
    or ``ValueError`` saying what was expected."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise TypeError(f"{argument}: expected a checkpoint path (str or os.PathLike), got {type(value).__name__}")
    path = os.fspath(value)
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise ValueError(f"{argument}: folder {path!r} holds no 'checkpoint' file naming a checkpoint; "
                             "pass the checkpoint's prefix (the path before .index)")
        path = latest
    if not checkpoint_exists(path):
        raise ValueError(f"{argument}: {path!r} is not a checkpoint (expected a prefix with a .index file, "
                         "e.g. model.ckpt-1000)")
    return path


def _output_files(output: str) -> list:
    return [p for p in [output + ".index", *glob.glob(glob.escape(output) + ".data-*")]
            if os.path.lexists(p)]


def check_output(output, overwrite: bool) -> str:
    """``output`` as an absolute prefix, refused (``ValueError``) when it exists
    (unless ``overwrite``), is a symlink, or its nearest existing folder is not a
    folder or not writable (missing folders are created on writing)."""
    path = _paths.output_path(output, overwrite, "prefix of the checkpoint")
    # a missing folder is created on writing, as tf.train.Checkpoint.write does
    _paths.check_folder(path, "a checkpoint prefix")
    if os.path.isdir(path):
        raise ValueError(f"output: {path!r} is a folder; expected a checkpoint prefix such as {path}/model")
    existing = _output_files(path)
    links = [p for p in existing + [path] if os.path.islink(p)]
    if links:
        raise ValueError(f"output: {links[0]!r} is a symlink; refusing to write through it")
    if existing and not overwrite:
        raise ValueError(f"output: a checkpoint exists at {path!r} ({os.path.basename(existing[0])}); "
                         "pass overwrite=True (--overwrite) to replace it")
    return path


def _check_not_input(output: str, source: str) -> None:
    """Refuse an output prefix that is the input checkpoint's or shares a file with it
    (through symlinks, hard links or ``..``): even ``overwrite`` never replaces the source."""
    same = os.path.realpath(output) == os.path.realpath(source)
    if not same:
        for mine in _output_files(output):
            for theirs in _output_files(source):
                try:
                    same = same or os.path.samefile(mine, theirs)
                except OSError:
                    continue
    if same:
        raise ValueError(f"output: {output!r} is the input checkpoint {source!r} (or shares its files); "
                         "write the TF2 checkpoint to another prefix")


def _make_optimizer(optimizer):
    if optimizer is None:
        return None
    if isinstance(optimizer, tf.keras.optimizers.Optimizer) or hasattr(optimizer, "apply_gradients"):
        return optimizer
    if callable(optimizer):
        made = optimizer()
        if not hasattr(made, "apply_gradients"):
            raise TypeError(f"optimizer: the factory returned {type(made).__name__}, not a Keras optimizer")
        return made
    raise TypeError(f"optimizer: expected a tf-keras optimizer, a Keras 3 optimizer or a zero-argument factory, "
                    f"got {type(optimizer).__name__}")


def _learning_rate(optimizer) -> float:
    config = optimizer.get_config().get("learning_rate")
    if not isinstance(config, (int, float, np.floating)):
        raise ValueError("optimizer: a learning-rate schedule: TF1 Momentum's accumulator converts to a "
                         "tf-keras SGD velocity (m = -learning_rate * a) only with a constant learning rate")
    return float(config)


def convert(tf1_checkpoint, tf2_layer, inputs, output, *, rename=None, optimizer=None,
            overwrite: bool = False, layer=None, slot_layout=None, format: str = "checkpoint") -> tuple:
    """:func:`convert_checkpoint`, returning ``(Conversion, layer, optimizer)``;
    ``layer`` (already called, the engine's own) replaces ``tf2_layer()``. SIGTERM
    stops it as Ctrl-C does (see :mod:`equivtool.engine.signals`)."""
    with _signals.sigterm_unwinds():
        return _convert(tf1_checkpoint, tf2_layer, inputs, output, rename=rename, optimizer=optimizer,
                        overwrite=overwrite, layer=layer, slot_layout=slot_layout, format=format)


def _convert(tf1_checkpoint, tf2_layer, inputs, output, *, rename, optimizer, overwrite, layer,
             slot_layout, format) -> tuple:
    path = checkpoint_path(tf1_checkpoint)
    keras_file = _keras_file.check_format(format) == "keras"
    out = _keras_file.check_keras_output(output, overwrite) if keras_file else check_output(output, overwrite)
    _check_not_input(out, path)
    if layer is None and (isinstance(tf2_layer, tf.Module) or not callable(tf2_layer)):
        raise TypeError("tf2_layer: expected a zero-argument factory returning a Keras layer or tf.Module "
                        f"(a layer instance would have its weights replaced), got {type(tf2_layer).__name__}")
    check_inputs(inputs)
    if slot_layout is not None and not isinstance(slot_layout, _slots.SlotLayout):
        raise TypeError(f"slot_layout: expected an equivtool.SlotLayout (e.g. equivtool.ADAM_WEIGHT_DECAY), "
                        f"got {type(slot_layout).__name__}")
    renamer = make_renamer(as_rename(rename))
    if optimizer is not None and not (callable(optimizer) or hasattr(optimizer, "apply_gradients")):
        raise TypeError(f"optimizer: expected a tf-keras optimizer, a Keras 3 optimizer or a zero-argument factory, "
                        f"got {type(optimizer).__name__}")
    reader, shapes, dtypes = open_tf1_checkpoint(path)
    if layer is None:
        # A VariableMapping's rules name the layers as map_variables saw them.
        with fresh_layer_numbering() if isinstance(renamer, MappingRenamer) else contextlib.nullcontext():
            layer = make_layer(tf2_layer)
        layer(tf.nest.map_structure(tf.convert_to_tensor, inputs), training=False)
    opt = _make_optimizer(optimizer)
    if keras_file:
        _keras_file.check_keras_model(layer, opt)
    kind = _slots.keras_kind(opt) if opt is not None else None

    problems, model, keys = [], [], {}
    for variable in layer_variables(layer):
        name = variable_name(variable)
        key = renamer(name)
        keys[name] = key
        if key not in shapes:
            problems.append(f"TF2 variable {name!r} has no TF1 counterpart (looked up as {key!r})")
            continue
        shape, dtype = variable_shape(variable).as_list(), variable_dtype(variable)
        declared = renamer.transforms.get(key) if isinstance(renamer, MappingRenamer) else None
        if declared is not None and (tuple(shapes[key]) != declared[1] or tuple(shape) != declared[2]):
            problems.append(f"{key!r}: shape {list(shapes[key])} in the checkpoint, {shape} for TF2 {name!r}; "
                            f"the declared {declared[0]} is from {list(declared[1])} to {list(declared[2])}")
        elif declared is None and tuple(shapes[key]) != tuple(shape):
            problems.append(f"{key!r}: shape {list(shapes[key])} in the checkpoint, {shape} for TF2 {name!r}"
                            + ("; a transposed layout? declare mapping.resolve({key: (tf2_name, 'transpose')})"
                               if tuple(shapes[key])[::-1] == tuple(shape) else ""))
        elif dtypes[key].base_dtype != dtype:
            problems.append(f"{key!r}: dtype {dtypes[key].name} in the checkpoint, {dtype.name} "
                            f"for TF2 {name!r}")
        else:
            model.append((variable, key))
    used = {key for _, key in model}
    slot_suffixes, non_slot, unmatched, orphan_slots = {}, {}, [], 0
    for key in sorted(shapes):
        if key in used or key in keys.values():
            continue
        parent, _, suffix = key.rpartition("/")
        if parent in used or parent in keys.values():
            slot_suffixes.setdefault(parent, []).append(suffix)
        elif key in ("global_step", "beta1_power", "beta2_power"):
            non_slot[key] = _scalar(key, reader.get_tensor(key))
        elif parent in shapes:  # a slot of a variable that is itself unmatched: named once, with it
            orphan_slots += 1
        else:
            unmatched.append(key)
    problems += [f"TF1 variable {key!r} has no TF2 counterpart" for key in unmatched]
    if problems:
        missed = [n for n, k in keys.items() if k not in shapes]
        hint = renumbering_hint(missed, renamer) or native_rewrite_hint(
            unmatched, missed, len(model), remedy="mapping = equivtool.map_checkpoint(tf1_checkpoint, make_layer, "
                                                  "inputs), then convert_checkpoint(..., rename=mapping) (on the "
                                                  "command line: equivtool convert-checkpoint ... --map)")
        shown = problems[:_SHOWN] + ([f"... and {len(problems) - _SHOWN} more"] if len(problems) > _SHOWN else [])
        if orphan_slots:
            shown.append(f"(and {orphan_slots} optimizer slots of those TF1 variables, left out with them)")
        raise ValueError(f"{len(problems)} variables do not map (no file written); "
                         + (f"{hint}" if hint else "fix rename= or the model") + ":\n  " + "\n  ".join(shown))

    # What is assigned, once every check has passed: a refused conversion
    # leaves the caller's optimizer as it was.
    slots, assignments, left_out, notes, iterations, family = [], [], [], [], None, ""
    global_step = int(non_slot["global_step"]) if "global_step" in non_slot else None
    if opt is None:
        left_out += [(f"{p}/{s}", NO_OPTIMIZER) for p, ss in slot_suffixes.items() for s in ss]
        left_out += [(k, NO_OPTIMIZER) for k in non_slot]
    else:
        if slot_layout is not None:
            layout = _slots.declared_layout(slot_layout, kind)
            family = layout.tf1
        else:
            family, renamed = _slots.find_family(slot_suffixes, kind, non_slot)
            layout = renamed(_slots.layout_for(family, kind, opt))
        trainable = list(layer.trainable_variables)
        opt.build(trainable)
        names = {tf1_slot: _slots.slot_name(opt, kind, keras_slot)
                 for tf1_slot, _, keras_slot, _ in layout.slots if keras_slot is not None}
        by_slot = {(slot, id(variable)): target for slot, variable, target
                   in _slots.slot_variables(opt, trainable, tuple(names.values()))}
        lr = _learning_rate(opt) if any(t == "times_minus_lr" for *_, t in layout.slots) else None
        consumed, slot_problems = set(), []
        for variable in trainable:
            name = variable_name(variable)
            key = keys[name]
            for tf1_slot, suffix, keras_slot, transform in layout.slots:
                source = f"{key}/{suffix}"
                if source not in shapes:
                    slot_problems.append(f"slot {source!r} ({family} {tf1_slot} of {key!r}) is not in the "
                                         f"checkpoint; tf-keras {keras_slot or tf1_slot!r} of {name!r} needs it")
                    continue
                consumed.add(source)
                if keras_slot is None:
                    left_out.append((source, f"tf-keras {kind} with these settings keeps no {tf1_slot}"))
                    continue
                target = by_slot.get((names[tf1_slot], id(variable)))
                if target is None:
                    slot_problems.append(f"the {kind} optimizer has no slot {names[tf1_slot]!r} for {name!r}")
                    continue
                value = tf2_value(renamer, key, reader.get_tensor(source))
                if tuple(value.shape) != tuple(target.shape.as_list()):
                    slot_problems.append(f"slot {source!r} has shape {list(value.shape)} in the checkpoint; "
                                         f"tf-keras {keras_slot!r} of {name!r} has {target.shape.as_list()}")
                    continue
                if transform == "times_minus_lr":
                    value = -lr * value
                slots.append((f"{names[tf1_slot]}/{name}", source, transform))
                assignments.append((target, value.astype(variable_dtype(target).as_numpy_dtype)))
        for parent, suffixes in slot_suffixes.items():
            for suffix in suffixes:
                if f"{parent}/{suffix}" not in consumed:
                    slot_problems.append(f"slot {parent}/{suffix} has no tf-keras counterpart (its variable is "
                                         "not trainable in TF2, or not in the optimizer's layout)")
        if family == "Adam":
            for name in ("beta1_power", "beta2_power"):
                if name not in non_slot:
                    slot_problems.append(f"{name} is not in the checkpoint: Adam's step count needs it")
        if slot_problems:
            raise ValueError(f"optimizer state does not convert ({len(slot_problems)} problems, no file "
                             "written):\n  " + "\n  ".join(slot_problems))
        if family == "Adam":
            iterations = _slots.iterations_from_betas(non_slot["beta1_power"], non_slot["beta2_power"],
                                                      float(opt.beta_1), float(opt.beta_2), global_step)
        elif global_step is not None:
            iterations = global_step
        else:
            iterations = 0
            notes.append("no global_step in the checkpoint: iterations set to 0")
        assignments.append((opt.iterations, iterations))
        notes += list(layout.notes)
        config = opt.get_config()
        keys = ("learning_rate", "beta_1", "beta_2", "epsilon", "momentum", "nesterov", "rho", "centered",
                "initial_accumulator_value", "weight_decay")
        shown = [f"{k}={float(config[k]):.6g}" if isinstance(config[k], (float, np.floating)) else
                 f"{k}={config[k]}" for k in keys if k in config]
        notes.append(f"the {_optimizer_module(opt)}.{kind}'s hyperparameters (check them against the TF1 run's): "
                     + ", ".join(shown))
        if global_step is not None and family != "Adam":
            notes.append(f"iterations = global_step = {global_step}")
    # every read before any assign; a declared transform gives the TF2 layout
    values = [(variable, tf2_value(renamer, key, reader.get_tensor(key))) for variable, key in model]
    for variable, value in assignments + values:
        variable.assign(value)
    checkpoint = None
    if not keras_file:
        checkpoint = tf.train.Checkpoint(model=layer, **({"optimizer": opt} if opt is not None else {}))
        # tf.train.Checkpoint.restore creates save_counter; written here (0), the
        # idiomatic restore(prefix).assert_consumed() finds it in the file.
        checkpoint.save_counter  # noqa: B018 - the property creates the variable
    made = _make_folders(os.path.dirname(out))
    try:
        written = _keras_file.write_keras(layer, opt, out) if keras_file else _write_atomically(checkpoint, out)
    except BaseException:
        _remove_folders(made)
        raise
    return _conversion(written, model, slots, left_out, iterations, family, opt, notes), layer, opt


def _conversion(written, model, slots, left_out, iterations, family, opt, notes) -> Conversion:
    kind = _slots.keras_kind(opt) if opt is not None else None
    return Conversion(
        written, tuple((variable_name(v), k) for v, k in model), tuple(slots), tuple(left_out), iterations,
        f"TF1 {family} -> {_optimizer_module(opt)}.{kind}" if opt is not None else "", tuple(notes))


def _optimizer_module(optimizer) -> str:
    return "keras.optimizers" if is_keras3(optimizer) else "tf.keras.optimizers"


def _varint(data: bytes, pos: int) -> tuple:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7


def index_shards(index: str):
    """The number of data files the checkpoint index ``index`` names, or None when it
    cannot be read. The index is a table whose first entry, under the empty key,
    is TensorFlow's ``BundleHeaderProto``; its field 1 is ``num_shards``."""
    try:
        with open(index, "rb") as f:
            head = f.read(64)
        if head[:2] != b"\0\0":  # the first key: nothing shared with a previous key, 0 bytes long
            return None
        length, pos = _varint(head, 2)
        header, pos = head[pos:pos + length], 0
        while pos < len(header):
            tag, pos = _varint(header, pos)
            if tag == 0x08:  # field 1, a varint
                return _varint(header, pos)[0] or None
            wire = tag & 7
            if wire == 0:
                pos = _varint(header, pos)[1]
            elif wire == 2:
                size, pos = _varint(header, pos)
                pos += size
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                return None
    except (OSError, IndexError):
        return None
    return None


_DATA = re.compile(r"\.data-\d{5}-of-(\d{5})$")


def _data_files(output: str) -> dict:
    """``output``'s data files: path -> the shard count in its name."""
    found = {}
    for path in glob.glob(glob.escape(output) + ".data-*"):
        match = _DATA.search(path[len(output):])
        if match is not None:
            found[path] = int(match.group(1))
    return found


class _Shards(tf.train.experimental.ShardingCallback):
    """Exactly ``count`` data files (tensors dealt round-robin): a shard count that
    differs from the checkpoint being replaced gives data files of other names."""

    def __init__(self, count: int):
        self.count = count

    @property
    def description(self) -> str:
        return f"equivtool: {self.count} shards"

    def __call__(self, shardable_tensors):
        if len(shardable_tensors) < self.count:
            raise ValueError(f"output: the checkpoint has {len(shardable_tensors)} tensors, too few for "
                             f"{self.count} data files; remove the data files beside it or choose another prefix")
        shards = [{} for _ in range(self.count)]
        for i, tensor in enumerate(shardable_tensors):
            shards[i % self.count].setdefault(tensor.checkpoint_key, {})[tensor.slice_spec] = tensor.tensor
        return shards


def _write_atomically(checkpoint, output: str) -> str:
    """Write ``checkpoint`` to ``output`` so that one rename decides (see the module
    docstring): staged beside it, data files of a shard count no file there has,
    moved in; the index renamed over the old one; then the old data files removed.
    Nothing is left behind on failure, SIGTERM or Ctrl-C."""
    folder, base = os.path.split(output)
    scratch.remove_stale(folder, "convert", hidden=True)  # staging folders of killed runs
    current = index_shards(output + ".index")
    if current is not None or not os.path.lexists(output + ".index"):  # (an index it cannot read: keep all)
        for path, count in _data_files(output).items():  # named by no index: a killed run's, or no index at all
            if count != current:
                os.unlink(path)
    present = set(_data_files(output).values())
    shards = next(n for n in range(1, len(present) + 2) if n not in present)
    staging = tempfile.mkdtemp(prefix=scratch.prefix("convert", hidden=True), dir=folder)
    try:
        checkpoint.write(os.path.join(staging, base),
                         options=tf.train.CheckpointOptions(experimental_sharding_callback=_Shards(shards)))
        names = sorted(os.listdir(staging))
        index = base + ".index"
        if index not in names or set(_data_files(os.path.join(staging, base)).values()) != {shards}:
            raise ValueError(f"output: TensorFlow wrote {', '.join(names)}; expected {index} and "
                             f"{shards} data files")
        with _signals.shielded():  # a SIGTERM now waits until the new checkpoint is whole, or the old one is
            for name in names:
                destination = os.path.join(folder, name)
                if os.path.islink(destination):
                    raise ValueError(f"output: {destination!r} became a symlink; refusing to write through it")
            for name in [n for n in names if n != index]:  # new names: the old checkpoint is untouched
                os.replace(os.path.join(staging, name), os.path.join(folder, name))
            os.replace(os.path.join(staging, index), output + ".index")  # the commit point
            for path, count in _data_files(output).items():
                if count != shards:
                    os.unlink(path)
    finally:
        with _signals.shielded():
            shutil.rmtree(staging, ignore_errors=True)
    return output


def _make_folders(folder: str) -> list:
    """Create ``folder`` and its missing parents (as ``tf.train.Checkpoint.write``
    does); returns those created, outermost first, for :func:`_remove_folders`."""
    made, missing = [], folder
    while not os.path.isdir(missing):
        made.insert(0, missing)
        missing = os.path.dirname(missing)
    try:
        for new_folder in made:
            os.mkdir(new_folder)
    except OSError as exc:
        _remove_folders(made)
        raise ValueError(f"output: cannot create folder {folder!r}: {short(exc)}") from None
    return made


def _remove_folders(made: list) -> None:
    """Remove the folders a failed write created (innermost first), if empty."""
    for created in reversed(made):
        try:
            os.rmdir(created)
        except OSError:
            pass


def convert_checkpoint(tf1_checkpoint: str | os.PathLike, tf2_layer: Callable, inputs: Any,
                       output: str | os.PathLike, *, rename=None, optimizer=None,
                       overwrite: bool = False, slot_layout=None, format: str = "checkpoint") -> str:
    """Write a TF2 checkpoint ``tf.train.Checkpoint(model=layer, optimizer=optimizer)``
    from a TF1 name-based checkpoint.

    Args:
      tf1_checkpoint: the TF1 checkpoint's prefix (``model.ckpt-1000``) or its folder.
      tf2_layer: a zero-argument factory returning the TF2 layer (as for
        :func:`equivtool.check_equivalence`); it is called once on ``inputs``
        to create its variables.
      inputs: a NumPy array (or nested structure) to build the layer with.
      output: the prefix to write (missing folders are created, as
        ``tf.train.Checkpoint.write`` does); with ``format="keras"`` the
        ``.keras`` file to write.
      rename: rules mapping each TF2 variable name to its TF1 name, or a
        :class:`~equivtool.VariableMapping` from :func:`equivtool.map_variables`.
      optimizer: a tf-keras or Keras 3 optimizer (``Adam``, ``SGD``, ``RMSprop``,
        ``Adagrad``) or a zero-argument factory: its slots and ``iterations``
        are filled from the TF1 optimizer's (Adam, Momentum, RMSProp,
        Adagrad, GradientDescent; under any optimizer name, read from the
        slots' structure) and it is saved as ``optimizer``. Without it only
        the model is written.
      overwrite: replace a checkpoint at ``output``.
      slot_layout: an :class:`~equivtool.SlotLayout` declaring the TF1
        optimizer's layout when it is not a TF1 optimizer's slots (BERT's
        ``AdamWeightDecayOptimizer``: :data:`~equivtool.ADAM_WEIGHT_DECAY`,
        ``<var>/adam_m`` and ``<var>/adam_v`` to an ``AdamW``'s or ``Adam``'s
        m and v); its notes (how the updates differ) are in the conversion.
      format: ``"checkpoint"`` (a TF2 object-based checkpoint) or ``"keras"``:
        a ``.keras`` file holding the model and, as its compiled optimizer,
        the converted optimizer (``tf2_layer`` must make a Keras 3
        ``keras.Model`` or a tf-keras ``tf.keras.Model`` whose class that
        Keras can deserialize, with an optimizer of the same Keras); load it
        with ``keras.saving.load_model(path)`` or
        ``tf_keras.models.load_model(path)``. Written atomically (a temporary
        file beside it, renamed; removed on every exit).

    Returns the prefix (or ``.keras`` file) written; restore it with
    ``tf.train.Checkpoint(model=layer, optimizer=optimizer).restore(prefix)``
    (``.assert_consumed()`` holds: the checkpoint has a ``save_counter``, 0)
    or ``.read(prefix)``.

    Every problem is named before anything is written (``ValueError``): a
    path that is not a checkpoint, TF1 or TF2 variables without a
    counterpart (all listed), shapes or dtypes that differ, an ambiguous
    mapping, an optimizer whose slot layout is unknown, slots missing,
    beta powers that disagree with ``global_step``, an existing output or a
    symlink there.
    """
    return convert(tf1_checkpoint, tf2_layer, inputs, output, rename=rename, optimizer=optimizer,
                   overwrite=overwrite, slot_layout=slot_layout, format=format)[0].path
