"""`sr-blockwise examples`: write the built-in example faces as image files, e.g. as the batch
command's input (the README's quick start)."""
from __future__ import annotations


def cmd_examples(a) -> int:
    from ..examples import builtin_examples, celeba_examples, write_examples

    examples = builtin_examples()
    if a.celeba:
        held_out = celeba_examples(a.data, n=a.celeba)
        if not held_out:
            raise FileNotFoundError(f"--celeba {a.celeba}: no CelebA faces at "
                                    f"{a.data or 'the configured data path'} (data/README.md says how to prepare them)")
        examples += held_out
    paths = write_examples(examples, a.folder)
    print(f"wrote {len(paths)} example faces to {a.folder}/: "
          + ", ".join(ex.name for ex in examples))
    return 0


def register(sub):
    p = sub.add_parser("examples", help="write the built-in example faces into a folder",
                       description="Write the built-in example faces (scikit-image's astronaut and cameraman, an "
                                   "8x8 input, greyscale LFW faces; optionally held-out CelebA faces) as PNG "
                                   "files, e.g. for `sr-blockwise upscale FOLDER -o OUT`. Files of the same "
                                   "names are replaced.")
    p.add_argument("folder", help="where to write them (made if missing)")
    p.add_argument("--celeba", type=int, default=0, metavar="N",
                   help="also N held-out CelebA test faces, evenly spread (needs the prepared data)")
    p.add_argument("--data", default=None, help="CelebA .npz to read them from (default: the configured data path)")
    p.set_defaults(func=cmd_examples)
