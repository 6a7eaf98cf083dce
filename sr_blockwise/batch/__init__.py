"""Batch upscaling: folders, files and globs of faces in, 32x32 results out.

The pipeline per image is the Python API's (api.Upscaler), the demo's too: the photo is read
(data.open_rgb; large photos at reduced size), its faces found and aligned to the training
framing (sr_blockwise.faces; --faces largest or all; 8x8 and 32x32 images are used as they are,
--faces none takes the centre square or CelebA's crop), each 32x32 crop area-downsampled to 8x8
-> blockwise decoding -> 32x32, and with --paste-back the whole photo with the results pasted
back, at the scale the model works at (faces.paste_plan). Images are decoded together in batches, in every
mode; the decoder keeps each image's own position and accepted length (and, sampling, its own
seed), so an image's output does not depend on its batch.

Safety rules, each enforced in this package:
- outputs are written to a hidden temporary file in the target folder and renamed into place, so
  an interrupted run never leaves a half-written image (and --skip-existing can trust what exists);
- no output path may be an input (or ground-truth) file: such runs are refused before any work;
- a file that cannot be read is recorded with its reason and the run goes on;
- the first Ctrl-C (or SIGTERM) finishes the current batch and stops with a summary; a second
  one stops at once (the unfinished batch is simply not written).

The package, a module per part (sr_blockwise.upscale gathers their public names; the package
itself re-exports none, so that `batch.plan` and `batch.run` stay the modules):
- plan.py: the command's Config, inputs found, outputs named, ground truth matched, shards;
- files.py: atomic writes marked as this tool's, temporary files, the checks before writing;
- photos.py: a file's faces, pasting back, ground truth, the compare strip, quality;
- report.py: the summary, the metrics file, paths shown in messages;
- run.py: the run itself (BatchRun), stage by stage.
"""
