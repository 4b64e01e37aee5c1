//! A build without the optional features (`cargo test -p dp-data --no-default-features`)
//! refuses what they do with an error naming the feature, never a panic: object storage
//! locations without `objects`, decoding an image feature without `images`. With the
//! features, the same calls get past these checks (covered by the object_store and images
//! tests).

#[path = "support/temp_dir.rs"]
#[allow(dead_code)]
mod temp_dir;

#[cfg(not(feature = "objects"))]
#[test]
fn an_object_storage_location_names_the_objects_feature() {
    let error = dp_data::Dataset::open("s3://bucket/prefix").expect_err("refused").to_string();
    assert!(error.contains("s3://bucket/prefix") && error.contains("`objects` feature"), "{error}");
}

#[cfg(not(feature = "images"))]
#[test]
fn an_image_input_names_the_images_feature() {
    use dp_data::{
        DType, DatasetWriter, Feature, ImageInput, Pipeline, PipelineConfig, Schema, Value,
        WriterOptions,
    };

    let dir = temp_dir::scratch_dir("no-images");
    let schema =
        Schema::new(vec![Feature::image("image"), Feature::dense("label", DType::I64, &[])])
            .unwrap();
    let mut writer = DatasetWriter::create(dir.path(), schema, WriterOptions::default()).unwrap();
    // A stored image's header (JPEG, 3 channels, 16x16) in front of bytes that are never
    // decoded: the header is all a dataset checks without the decoders.
    let mut stored = vec![1, 3, 0, 0];
    stored.extend_from_slice(&16u32.to_le_bytes());
    stored.extend_from_slice(&16u32.to_le_bytes());
    stored.extend_from_slice(&[0xFF, 0xD8, 0xFF]);
    for label in 0..4i64 {
        writer.append(&[Value::Bytes(&stored), Value::dense(&[label])]).unwrap();
    }
    writer.finish().unwrap();

    let mut config = PipelineConfig::default();
    config.input = "image".into();
    config.batch_size = 2;
    config.image = Some(ImageInput::eval(8, 3));
    let error = Pipeline::new(dir.path(), config, Vec::new()).expect_err("refused").to_string();
    assert!(error.contains("`images` feature"), "{error}");

    let mut sampler = dp_data::ImageSampler::new();
    let mut out = vec![0.0; 3 * 8 * 8];
    let input = ImageInput::eval(8, 3);
    let what = sampler
        .sample(&stored, &input, (1.0, 0.0), &mut dp_data::Rng::new(7), &mut out)
        .unwrap_err();
    assert!(what.contains("`images` feature"), "{what}");
}
