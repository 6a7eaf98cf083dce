"""Faces in real photos (sr_blockwise.faces): MTCNN detection, alignment to the training template,
paste-back. Real photos: scikit-image's astronaut and held-out CelebA photos; the real detector."""
import math

import numpy as np
import pytest
import skimage.data
from PIL import Image

from sr_blockwise import faces as F
from sr_blockwise.data import DEFAULT_DATA, BadImage, CELEBA_BOX, downsample_8


@pytest.fixture(scope="module")
def astronaut():
    return Image.fromarray(skimage.data.astronaut())


@pytest.fixture(scope="module")
def celeba_photos():
    folder = DEFAULT_DATA / "celeba" / "img_align_celeba"
    if not folder.is_dir():
        import os
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"CelebA photos not found at {folder}")
    # held-out test ids (id % 16 == 0, test partition: ids after 182637)
    files = sorted(f for f in folder.glob("*.jpg") if int(f.stem) > 182637 and int(f.stem) % 16 == 0)
    return [Image.open(f).convert("RGB") for f in files[:3]]


def rotate(img: Image.Image, degrees: float, scale: float, shift=(0, 0), size=None) -> tuple[Image.Image, np.ndarray]:
    """The photo moved by a known similarity (about its centre): the new photo and the (3, 3)
    matrix from old photo points to new ones."""
    w, h = img.size
    W, H = size or (w, h)
    th = math.radians(degrees)
    c, s = scale * math.cos(th), scale * math.sin(th)
    cx, cy = w / 2, h / 2
    m = np.array([[c, -s, W / 2 + shift[0] - c * cx + s * cy], [s, c, H / 2 + shift[1] - s * cx - c * cy], [0, 0, 1]])
    inv = np.linalg.inv(m)
    out = img.transform((W, H), Image.Transform.AFFINE, tuple(inv[:2].ravel()), Image.Resampling.BICUBIC)
    return out, m


def test_detects_the_astronaut_with_landmarks(astronaut):
    (box, score, marks), = F.detect(astronaut)
    left, top, right, bottom = box
    assert 150 < left < right < 300 and 40 < top < bottom < 200 and score > 0.99
    eyes, nose, mouth = marks[:2], marks[2], marks[3:]
    assert eyes[0, 0] < eyes[1, 0] and mouth[0, 0] < mouth[1, 0]  # left and right as seen
    assert eyes[:, 1].max() < nose[1] < mouth[:, 1].min()  # eyes above the nose above the mouth
    assert all(left <= x <= right and top <= y <= bottom for x, y in marks)
    # a large photo is detected on a reduced copy; boxes come back in its own pixels
    (big, _, big_marks), = F.detect(astronaut.resize((2048, 2048), Image.Resampling.BICUBIC), max_side=512)
    assert np.abs(big / 4 - box).max() < 6 and np.abs(big_marks / 4 - marks).max() < 4
    assert F.detect(Image.new("RGB", (300, 200), "white")) == []
    assert F.detect(Image.new("RGB", (5, 3), "white")) == []


def test_a_small_photos_mirrored_border_adds_no_faces(celeba_photos):
    """A small photo is detected on a copy mirrored outward: the mirror images of its faces there
    are not faces of the photo (three faces side by side gave five or six)."""
    crops = [p.crop((0, 20, 178, 198)).resize((32, 32), Image.Resampling.BOX) for p in celeba_photos]
    group = Image.fromarray(np.concatenate([np.asarray(c) for c in crops], 1))  # 96x32
    found = F.detect(group)
    centres = sorted(float(marks[:, 0].mean()) for _, _, marks in found)
    assert len(found) == 3 and all(32 * i < x < 32 * (i + 1) for i, x in enumerate(centres)), centres
    # a face the photo's edge cuts through near its nose is still the photo's face, found once
    for photo in celeba_photos:
        cut = photo.crop((88, 20, 178, 198))
        cut = cut.resize((round(cut.width * 48 / cut.height), 48), Image.Resampling.BOX)
        assert len(F.detect(cut)) == 1


def test_small_faces_of_a_large_photo_found_as_facenet_pytorch_finds_them(celeba_photos):
    """faces.detect drives MTCNN's networks itself (PIL's pyramid, channels-last networks): on a
    12 MP photo with faces 20-50 px wide in the 1600 px copy it finds every face, and nothing else,
    where facenet-pytorch's own MTCNN.detect finds them, with the same boxes and landmarks."""
    from facenet_pytorch import MTCNN
    photo = Image.fromarray(skimage.data.coffee()).resize((4000, 3000), Image.Resampling.BICUBIC)  # texture everywhere
    squares = []
    for i, side in enumerate((80, 100, 120, 140, 170, 200)):  # the paper's crop: the face is ~0.6 of it
        x, y = 300 + i * 600, 400 + (i % 2) * 1500
        photo.paste(celeba_photos[i % 3].crop(CELEBA_BOX).resize((side, side), Image.Resampling.BOX), (x, y))
        squares.append((x + side / 2, y + side / 2, side))
    found = F.detect(photo)
    assert len(found) == len(squares)
    for cx, cy, side in squares:
        (box, score, marks), = [f for f in found if abs((f[0][0] + f[0][2]) / 2 - cx) < side / 4
                                and abs((f[0][1] + f[0][3]) / 2 - cy) < side / 4]
        assert score >= F.MIN_SCORE and all(box[0] <= x <= box[2] and box[1] <= y <= box[3] for x, y in marks)
    # facenet-pytorch's own detection on the same copy: the same faces, boxes and landmarks
    work, _ = F.detect_copy(photo)
    ref_boxes, ref_scores, ref_marks = MTCNN(keep_all=True, device="cpu", min_face_size=F.MIN_FACE).detect(work, landmarks=True)
    k = photo.width / work.width
    ref = [(b * k, m * k) for b, s, m in zip(ref_boxes, ref_scores, ref_marks) if s >= F.MIN_SCORE]
    assert len(ref) == len(found)
    for box, _, marks in found:
        side = box[2] - box[0]
        ref_box, ref_mark = min(ref, key=lambda r: np.abs(r[0] - box).max())
        assert np.abs(ref_box - box).max() < 0.1 * side and np.abs(ref_mark - marks).max() < 0.1 * side


def test_largest_only_stops_at_the_largest_face(astronaut, celeba_photos):
    """--faces largest searches the pyramid from its largest faces down and stops at a face no
    smaller one could outgrow: the same largest face as a whole search, the small faces not
    looked for; a photo whose faces are all small is searched whole."""
    photo = Image.fromarray(skimage.data.coffee()).resize((1600, 1200), Image.Resampling.BICUBIC)
    photo.paste(astronaut.resize((768, 768), Image.Resampling.BICUBIC), (50, 50))  # her face ~150 px wide
    for i, p in enumerate(celeba_photos):  # faces about 24 px wide
        photo.paste(p.crop(CELEBA_BOX).resize((40, 40), Image.Resampling.BOX), (900 + 200 * i, 800))
    every = F.detect(photo)
    largest = F.detect(photo, largest_only=True)
    assert len(every) == 4 and len(largest) < len(every)
    assert np.abs(largest[0][0] - every[0][0]).max() < 0.01 and np.abs(largest[0][2] - every[0][2]).max() < 0.01
    (face,) = F.find_faces(photo, largest_only=True)
    assert np.abs(np.array(face.box) - every[0][0]).max() < 0.01
    small = photo.crop((800, 700, 1600, 1200))  # the small faces alone
    every, largest = F.detect(small), F.detect(small, largest_only=True)
    assert len(every) == len(largest) == 3
    assert all(np.abs(a[0] - b[0]).max() < 0.01 for a, b in zip(every, largest))


def test_aligned_crop_puts_the_landmarks_on_the_template_and_back(astronaut):
    """Warp the face onto the template (drawn 4x larger, 128x128), detect it there, and map those
    landmarks back with the inverse transform: they land where they were in the photo."""
    face, = F.find_faces(astronaut)
    assert face.crop.shape == (32, 32, 3) and (face.lr == downsample_8(face.crop)).all()
    assert np.abs(F.apply(face.matrix, face.landmarks) - F.TEMPLATE).max() < 1.5  # least squares fit
    up4 = np.diag([4.0, 4.0, 1.0]) @ face.matrix
    big = Image.fromarray(F.warp_crop(astronaut, up4, size=128))
    (_, _, marks), = F.detect(big)
    assert np.abs(marks / 4 - F.TEMPLATE).max() < 1.5  # in the crop: at the template
    back = F.apply(np.linalg.inv(up4), marks)
    assert np.abs(back - face.landmarks).max() < 4  # px of a 512x512 photo; the face is ~140 px wide


def test_alignment_undoes_rotation_scale_and_shift(celeba_photos):
    """The same face moved by a known similarity gives the same aligned crop."""
    for photo in celeba_photos:
        face, = F.find_faces(photo)[:1]
        moved, m = rotate(photo, 20, 0.8, (15, -10), size=(260, 260))
        again, = F.find_faces(moved)[:1]
        # the moved photo's alignment composed with the move is the photo's: the same angle,
        # scale and place (up to the detector's landmark noise)
        both = again.matrix @ m
        angle = math.degrees(math.atan2(both[1, 0], both[0, 0]) - math.atan2(face.matrix[1, 0], face.matrix[0, 0]))
        assert abs(angle) < 5 and abs(again.size / (0.8 * face.size) - 1) < 0.08, (angle, again.size, face.size)
        assert np.abs(F.apply(both, [[89, 109]]) - F.apply(face.matrix, [[89, 109]])).max() < 2  # crop px
        # the face itself (the crop's middle; its rim reaches past the moved photo's black border)
        diff = np.abs(again.crop.astype(int) - face.crop.astype(int))[8:26, 8:24]
        assert diff.mean() < 12, diff.mean()  # resampled twice, and the landmarks move a little
        moved_back = F.apply(np.linalg.inv(m), again.landmarks)  # the landmarks land where they were
        assert np.abs(moved_back - face.landmarks).max() < 5  # px of the 178x218 photo


def test_template_is_the_training_framing(celeba_photos):
    """On CelebA's own photos the aligned crop is close to the paper's crop (the training framing)."""
    for photo in celeba_photos:
        face, = F.find_faces(photo)[:1]
        paper = np.asarray(photo.crop(CELEBA_BOX).resize((32, 32), Image.Resampling.BOX), dtype=int)
        corners = F.apply(np.linalg.inv(face.matrix), [[0, 0], [32, 32]])
        assert np.abs(corners - [CELEBA_BOX[:2], CELEBA_BOX[2:]]).max() < 12  # px of 178x218
        assert np.abs(face.crop.astype(int) - paper).mean() < 20
        # what the front ends use for a CelebA-aligned photo: the paper's crop itself
        (used,), _ = F.faces_of(photo)
        assert used.how == "celeba crop" and (used.crop == paper).all()
    # a photo of CelebA's size that is no aligned CelebA photo: a large face off-centre and a
    # small one are each detected and aligned; neither becomes the fixed centre crop
    big = celeba_photos[0].crop((20, 40, 158, 178)).resize((110, 110), Image.Resampling.BOX)
    small = celeba_photos[1].crop((20, 40, 158, 178)).resize((60, 60), Image.Resampling.BOX)
    odd = Image.new("RGB", (178, 218), (120, 130, 110))
    odd.paste(big, (0, 0))
    odd.paste(small, (112, 150))
    found, _ = F.faces_of(odd, "all")
    assert [f.how for f in found] == ["detected", "detected"]
    assert found[0].box[2] < 115 and found[1].box[0] > 100  # the large one first, top left


def test_reflected_borders_and_area_resampling():
    grid = np.zeros((64, 64, 3), np.uint8)
    grid[:, ::2] = 255  # one-pixel stripes: area averaging gives grey, point sampling would not
    half = np.array([[0.5, 0, 0], [0, 0.5, 0], [0, 0, 1.0]])  # 64x64 -> 32x32
    crop = F.warp_crop(grid, half)
    assert np.abs(crop.astype(int) - 128).max() <= 1
    img = np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)
    assert (F.warp_crop(img, np.eye(3)) == img).all()  # the identity is exact
    # a photo (PIL) is read only where the crop reads; the same crop as from the whole array,
    # mirrored edges included
    photo = Image.fromarray(skimage.data.astronaut())
    for box in ((-20, -10, 60, 70), (200, 80, 300, 180), (480, 400, 530, 450)):
        m = F.box_matrix(box)
        assert (F.warp_crop(photo, m) == F.warp_crop(np.asarray(photo), m)).all()
    shifted = F.warp_crop(img, np.array([[1, 0, 4.0], [0, 1, 0], [0, 0, 1]]))  # 4 px past the left edge
    assert (shifted[:, 4:] == img[:, :28]).all()
    assert (shifted[:, :4] == img[:, 3::-1]).all()  # mirrored, as np.pad's "symmetric"


def test_box_and_centre_square(astronaut):
    face = F.face_in_box(astronaut, (181, 62, 268, 172))  # about the detector's box
    detected, = F.find_faces(astronaut)
    assert np.abs(face.crop.astype(int) - detected.crop.astype(int)).mean() < 25
    assert face.how == "box" and face.landmarks is None
    tiny = F.face_in_box(astronaut, (220, 110, 228, 118))  # an 8 px face box: a crop of ~11 px
    assert tiny.crop.shape == (32, 32, 3) and 10 < tiny.size < 12
    for bad, why in [((10, 10, 5, 20), "right > left"), ((600, 600, 700, 700), "outside")]:
        with pytest.raises(BadImage, match=why):
            F.face_in_box(astronaut, bad)
    c = F.centre_face(Image.new("RGB", (40, 20), "red"))
    assert c.how == "centre square" and c.box == (10.0, 0.0, 30.0, 20.0) and tuple(c.crop[0, 0]) == (255, 0, 0)


def test_a_photo_cropped_like_its_face_gives_the_faces_own_crop(astronaut, celeba_photos):
    """What the batch command crops a ground truth with: the photo itself gives each framing's
    own crop exactly (the paper's crop and the centre square resample otherwise than a warp);
    the same photo at twice the size gives nearly the same crop."""
    photo = celeba_photos[0]
    faces = [F.celeba_face(photo), F.centre_face(photo), F.centre_face(astronaut),
             F.find_faces(astronaut)[0], F.face_in_box(astronaut, (181, 62, 268, 172))]
    for face, img in zip(faces, [photo, photo, astronaut, astronaut, astronaut]):
        assert np.array_equal(F.crop_like(img, face, img.size), face.crop), face.how
        double = img.resize((2 * img.width, 2 * img.height), Image.Resampling.BICUBIC)
        assert np.abs(F.crop_like(double, face, img.size).astype(int) - face.crop).mean() < 3, face.how


def test_faces_of_says_what_it_found(astronaut):
    wall = Image.new("RGB", (200, 100), (90, 120, 150))
    assert F.faces_of(wall, if_none="skip") == ([], "no face found in the 200x100 photo")
    reduced = wall.copy()
    reduced.info["full_size"] = (2000, 1000)  # a large photo, read at reduced size (data.open_rgb)
    assert F.faces_of(reduced, if_none="skip") == ([], "no face found in the 2000x1000 photo")
    with pytest.raises(BadImage, match="no face found"):
        F.faces_of(wall, if_none="error")
    (c,), note = F.faces_of(wall)
    assert c.how == "centre square" and "centre square" in note
    (c,), note = F.faces_of(Image.new("RGB", (178, 218), (90, 120, 150)))  # CelebA's size: its crop
    assert c.how == "celeba crop" and "CelebA's crop" in note
    rng = np.random.default_rng(0)
    for side in (8, 32):  # the model's input, or a face at its size: used as it is, not searched
        small = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        (c,), note = F.faces_of(Image.fromarray(small))
        assert c.how == "as is" and note == f"a {side}x{side} image: used as it is"
        assert np.array_equal(c.lr if side == 8 else c.crop, small)
    # the astronaut beside herself at 0.6 of her size (mirrored out to the photo's height): two
    # faces of clearly different sizes, so "largest first" is a real order
    smaller = np.pad(np.asarray(astronaut.resize((307, 307), Image.Resampling.BOX)), ((0, 205), (0, 0), (0, 0)), mode="symmetric")
    pair = Image.fromarray(np.concatenate([np.asarray(astronaut), smaller], 1))
    both, note = F.faces_of(pair, "all")
    assert len(both) == 2 and note == "2 faces found"
    assert both[0].size >= both[1].size  # largest first
    one, note = F.faces_of(pair, "largest")  # its search stops at the largest face
    assert len(one) == 1 and note == "the largest face found"
    assert np.allclose(one[0].box, both[0].box, atol=0.5)
    with pytest.raises(ValueError, match="choose from"):
        F.faces_of(pair, "some")


def test_paste_back_changes_only_the_faces(astronaut):
    found = F.find_faces(astronaut)
    out = np.full((32, 32, 3), (0, 255, 0), np.uint8)  # a green "result": easy to find
    pasted = F.paste_back(astronaut, found, [out])
    plain = np.asarray(astronaut.resize((2048, 2048), Image.Resampling.BICUBIC))
    assert pasted.shape == plain.shape
    # where the mask is 0 (outside the warped-back crop) the pixels are the enlarged photo's
    ys, xs = np.mgrid[0:2048, 0:2048]
    to_crop = found[0].matrix @ np.diag([0.25, 0.25, 1])
    pts = F.apply(to_crop, np.stack([xs.ravel() + 0.5, ys.ravel() + 0.5], 1))
    weight = F.feather_mask(pts).reshape(2048, 2048)
    assert (pasted[weight == 0] == plain[weight == 0]).all()
    assert (weight > 0).mean() > 0.05  # the face is there
    # where the mask is 1, the result replaces the photo
    inside = pasted[weight == 1]
    assert (np.abs(inside.astype(int) - (0, 255, 0)) <= 1).all()
    # the smaller scale for a large photo
    assert F.paste_scale((4000, 3000)) == pytest.approx(math.sqrt(64e6 / 12e6))
    assert F.paste_scale((100, 100)) == 4


def test_a_large_face_is_pasted_at_the_models_scale(astronaut, rng):
    """Faces larger than the 32x32 output are pasted at the scale the model works at: the photo
    reduced so the largest face is 8 px, then 4x. No face comes out larger than 32 px, the largest
    about 32; a face much smaller than the model's input there is named."""
    photo = Image.new("RGB", (2400, 1400), (90, 110, 130))
    sides = rng.uniform(300, 700, 3)
    for i, side in enumerate(sides):  # faces of different sizes; the smallest boxed by hand
        photo.paste(astronaut.resize((round(side),) * 2, Image.Resampling.BICUBIC), (20 + 760 * i, 20))
    tiny = (2300.0, 1300.0, 2306.0, 1306.0)  # 6 px box: under 1 px at the largest face's scale
    faces = F.find_faces(photo) + [F.face_in_box(photo, tiny)]
    assert len(faces) == 4
    plan = F.paste_plan(photo.size, faces)
    big = int(np.argmax([f.size for f in faces]))
    assert plan.face == big and plan.scale == pytest.approx(32 / faces[big].size)
    assert f"face {big} ({faces[big].size:.0f} px)" in plan.note and plan.small == [3] and "face 3 is under 4 px" in plan.note
    # a photo read at reduced size: the note in its own pixels, the plan the same
    own = F.paste_plan(photo.size, faces, own_size=(4800, 2800))
    assert own.scale == plan.scale and own.note.startswith(f"{plan.note.split(':')[0]}: the photo at {plan.scale / 2:.3g}x")
    assert f"face {big} ({2 * faces[big].size:.0f} px)" in own.note
    out = np.full((32, 32, 3), (0, 255, 0), np.uint8)
    pasted = F.paste_back(photo, faces, [out] * 4, plan.scale)
    h, w = pasted.shape[:2]
    assert (w, h) == F.pasted_size(photo.size, plan.scale) and w % 4 == 0 and h % 4 == 0
    pasted_sides = [f.size * w / photo.width for f in faces]
    assert max(pasted_sides) <= 32 + 1e-6 and max(pasted_sides) > 30
    # outside the faces: the photo reduced (area) to a quarter of that and enlarged 4x (bicubic)
    canvas = F.paste_canvas(photo, plan.scale)
    small = photo.resize((w // 4, h // 4), Image.Resampling.BOX)
    assert (canvas == np.asarray(small.resize((w, h), Image.Resampling.BICUBIC))).all()
    green = (np.abs(pasted.astype(int) - (0, 255, 0)).max(-1) <= 1) & ~(canvas == (0, 255, 0)).all(-1)
    assert 0.5 * 3 * 28 ** 2 < green.sum() < 3 * 32 ** 2 + 100  # three faces of at most 32 px, pasted


def test_a_small_photos_faces_are_pasted_into_the_photo_4x(celeba_photos):
    """Faces at most 32 px gain pixels from the model: the photo is enlarged 4x, as the docs'
    96x24 group photo is, with the faces pasted at 4x; scale 4 is the photo's plain bicubic 4x
    outside the faces. A large photo of such faces is enlarged less, never below its own size."""
    crops = [p.crop(CELEBA_BOX).resize((24, 24), Image.Resampling.BOX) for p in celeba_photos]
    group = Image.fromarray(np.concatenate([np.asarray(c) for c in crops], 1))  # 72x24
    faces = [F.face_in_box(group, (24 * i + 6, 5, 24 * i + 18, 20)) for i in range(3)]
    assert all(f.size <= 32 for f in faces)
    plan = F.paste_plan(group.size, faces)
    assert (plan.scale, plan.face, plan.small) == (4, None, []) and plan.note.startswith("288x96: the photo 4x")
    outs = [np.full((32, 32, 3), 255 * (i % 2), np.uint8) for i in range(3)]
    pasted = F.paste_back(group, faces, outs, plan.scale)
    plain = np.asarray(group.resize((288, 96), Image.Resampling.BICUBIC))
    ys, xs = np.mgrid[0:96, 0:288]
    inside = np.zeros((96, 288), bool)
    for f in faces:
        pts = F.apply(f.matrix @ np.diag([0.25, 0.25, 1]), np.stack([xs.ravel() + 0.5, ys.ravel() + 0.5], 1))
        inside |= (F.feather_mask(pts) > 0).reshape(96, 288)
    assert (pasted[~inside] == plain[~inside]).all() and not (pasted[inside] == plain[inside]).all()
    big = F.paste_plan((8000, 6000), faces)  # 48 MP: enlarged to at most 64 MP, not reduced
    assert big.scale == pytest.approx(math.sqrt(64e6 / 48e6)) and big.face is None
    assert F.paste_scale((20000, 10000)) == 1
    assert F.paste_plan((100, 100), []).scale == 4
    assert F.paste_plan((100, 100), faces, scale=0.5).note.startswith("48x48: the photo at 0.5x, as asked; faces 0, 1, 2")
