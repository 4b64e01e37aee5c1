"""tf.data's image input path, the peer `cargo xtask bench data` measures in the same run: the
folder's JPEG files written once to a TFRecord file as `{'image': bytes, 'label': int64}`
Examples (the layout `tf.io.encode_jpeg` pipelines write), then TFRecordDataset -> parse ->
decode_and_crop_jpeg of a sample_distorted_bounding_box (area 0.08-1, aspect 3/4-4/3, the
Inception crop) -> resize to the size -> random flip -> float32 in [0, 1] -> batch ->
prefetch, every parallel stage AUTOTUNE, on a private pool of `--workers` threads.

    python3 scripts/images_tfdata.py target/bench-images/photos --size 224 --batch 64 --workers 2

Prints one JSON object: {"tensorflow": version, "images_per_s": the median over rounds of an
epoch's images over its time from the first request to the last batch}."""

import argparse
import json
import os
import statistics
import time

import tensorflow as tf


def write_tfrecord(folder: str, path: str) -> None:
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    with tf.io.TFRecordWriter(path + ".partial") as writer:
        for label, name in enumerate(classes):
            for file in sorted(os.listdir(os.path.join(folder, name))):
                with open(os.path.join(folder, name, file), "rb") as f:
                    image = f.read()
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
    os.replace(path + ".partial", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tf.random.set_seed(0)
    path = os.path.normpath(args.folder) + ".tfrecord"
    if not os.path.exists(path):
        write_tfrecord(args.folder, path)
    spec = {
        "image": tf.io.FixedLenFeature((), tf.string),
        "label": tf.io.FixedLenFeature((), tf.int64),
    }

    def sample(record):
        example = tf.io.parse_single_example(record, spec)
        shape = tf.io.extract_jpeg_shape(example["image"])
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            area_range=(0.08, 1.0),
            aspect_ratio_range=(3 / 4, 4 / 3),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.io.decode_and_crop_jpeg(example["image"], window, channels=3)
        image = tf.image.resize(image, [args.size, args.size], antialias=True) / 255.0
        return tf.image.random_flip_left_right(image), example["label"]

    options = tf.data.Options()
    options.threading.private_threadpool_size = args.workers
    rates = []
    for _ in range(max(args.rounds, 3)):
        dataset = (
            tf.data.TFRecordDataset(path)
            .shuffle(1024)
            .map(sample, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(args.batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
            .with_options(options)
        )
        started, images = time.perf_counter(), 0
        for x, _ in dataset:
            images += int(x.shape[0])
        rates.append(images / (time.perf_counter() - started))
    print(json.dumps({"tensorflow": tf.__version__, "images_per_s": statistics.median(rates)}))


if __name__ == "__main__":
    main()
