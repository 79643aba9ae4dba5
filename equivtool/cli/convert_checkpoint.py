"""``equivtool convert-checkpoint``: :func:`equivtool.convert_checkpoint` from the command line.

Exit codes as ``check``:
0 written, 2 bad usage or a checkpoint that does not convert (one line on
stderr naming the variable, slot or argument; nothing written).
"""

from __future__ import annotations

from equivtool.cli.common import (EXIT_OK, UsageError, importable_cwd, inputs_of, load_object, load_target,
                                  parse_shape)


def _inputs(args):
    """The inputs the layer is built with: the options of ``check`` (``--input-shape``,
    ``--inputs FILE.npz``, repeatable ``--input NAME:SHAPE:DTYPE[:LO,HI]``);
    ``--input-dtype int32|int64`` with ``--input-shape`` gives token ids, all 0."""
    if args.input_dtype != "float32":
        if not args.input_shape or args.inputs or args.input:
            raise UsageError("--input-dtype: applies to --input-shape only; give an integer input as "
                             "--input NAME:SHAPE:int32:LO,HI or in --inputs FILE.npz")
        import numpy as np
        return np.zeros(parse_shape(args.input_shape), args.input_dtype)  # id 0 is in every vocabulary
    return inputs_of(args, 0)[0]  # as `check` makes them, seed 0


def _proposed_mapping(tf1_checkpoint, factory, inputs):
    """``--map``: :func:`equivtool.map_checkpoint`'s mapping, said in one line;
    an incomplete one is refused with the ``resolve()`` call that completes it."""
    from equivtool.checkpoints.checkpoint_map import map_checkpoint

    mapping = map_checkpoint(tf1_checkpoint, factory, inputs)
    try:
        mapping.require_complete("--map")
    except ValueError as exc:
        raise ValueError(str(exc).replace("pass the completed mapping as --map=",
                                          "pass the completed mapping with --rename MODULE:OBJ")) from None
    renamed = sum(tf1 != tf2 for tf1, tf2 in mapping.pairs.items())
    print(f"--map: {len(mapping.pairs)} variables paired by role and structure ({renamed} renamed)", flush=True)
    return mapping


def run(args) -> int:
    inputs = _inputs(args)  # usage errors before TensorFlow is imported
    if args.map and args.rename:
        raise UsageError("--map and --rename: give one (--map proposes the mapping by role; --rename names rules "
                         "or a VariableMapping of your own)")
    from equivtool._platform.quiet import quiet_command
    quiet_command()
    from equivtool.checkpoints.convert import convert

    with importable_cwd():
        factory = load_target(args.tf2_factory, "MODULE:FACTORY")
        optimizer = load_target(args.optimizer, "--optimizer") if args.optimizer else None
        rename = load_object(args.rename, "--rename") if args.rename else None
        layout = load_object(args.slot_layout, "--slot-layout") if args.slot_layout else None
        try:
            if args.map:
                rename = _proposed_mapping(args.tf1_checkpoint, factory, inputs)
            conversion, _, _ = convert(args.tf1_checkpoint, factory, inputs, args.output, rename=rename,
                                       optimizer=optimizer, overwrite=args.overwrite, slot_layout=layout,
                                       format=args.format)
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from None
    print(conversion)
    return EXIT_OK


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("convert-checkpoint",
                            help="write a TF2 checkpoint (model and optimizer slots) from a TF1 one")
    parser.add_argument("tf1_checkpoint", metavar="TF1_CKPT", help="TF1 checkpoint prefix or folder")
    parser.add_argument("tf2_factory", metavar="MODULE:FACTORY", help="zero-argument factory of the TF2 layer")
    parser.add_argument("output", metavar="OUTPUT", help="prefix of the TF2 checkpoint to write (--format keras: "
                                                         "the .keras file)")
    parser.add_argument("--input-shape", default=None,
                        help="e.g. 1,224,224,3: a float32 input the layer is built with (standard normal)")
    parser.add_argument("--input-dtype", default="float32", choices=("float32", "int32", "int64"),
                        help="with --input-shape: the input's dtype (int32/int64: token ids, all 0) "
                             "(default float32)")
    parser.add_argument("--inputs", default=None, metavar="FILE.npz",
                        help="inputs from np.savez: keys arr_0..arr_N give a list, other keys a dict")
    parser.add_argument("--input", action="append", default=None, metavar="NAME:SHAPE:DTYPE[:LO,HI]",
                        help="one generated input of a dict (repeatable), e.g. input_ids:2,128:int32:0,30522")
    parser.add_argument("--optimizer", default=None, metavar="MODULE:FACTORY",
                        help="zero-argument factory of the tf-keras optimizer whose slots are filled")
    parser.add_argument("--rename", default=None, metavar="MODULE:OBJ",
                        help="rename rules (TF2 name -> TF1 name) or a VariableMapping")
    parser.add_argument("--map", action="store_true",
                        help="pair the checkpoint's variables with the layer's by role and structure "
                             "(equivtool.map_checkpoint), for a native rewrite whose names differ")
    parser.add_argument("--slot-layout", default=None, metavar="MODULE:OBJ",
                        help="a declared TF1 optimizer layout (an equivtool.SlotLayout, e.g. "
                             "equivtool:ADAM_WEIGHT_DECAY for BERT's AdamWeightDecayOptimizer)")
    parser.add_argument("--format", default="checkpoint", choices=("checkpoint", "keras"),
                        help="checkpoint: a TF2 checkpoint prefix (default); keras: a .keras file (Keras 3 or "
                             "tf-keras) with the model and its optimizer (OUTPUT ends in .keras)")
    parser.add_argument("--overwrite", action="store_true", help="replace a checkpoint (or .keras file) at OUTPUT")
    parser.set_defaults(run=run, starts_tensorflow=True)
