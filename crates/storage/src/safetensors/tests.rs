use super::*;
use crate::PathChoice;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    gdx_base::pattern::pattern(n, u64::from(seed))
}

fn spec(name: &str, dtype: Dtype, shape: &[u64]) -> TensorSpec {
    let len = header::tensor_bytes(name, dtype, shape).unwrap();
    TensorSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        len,
    }
}

/// Small chunks so that a small file crosses several chunks and tensors straddle them.
fn small() -> CopyOptions {
    CopyOptions {
        chunk_bytes: 8192,
        depth: 3,
        ..Default::default()
    }
}

fn write_file(path: &Path, specs: &[TensorSpec]) -> Vec<Vec<u8>> {
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| pattern(s.len as usize, i as u8))
        .collect();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    save(path, specs, &refs, &meta, &small()).unwrap();
    data
}

#[test]
fn saved_files_load_back_byte_for_byte_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    let specs = vec![
        spec("embed", Dtype::BF16, &[100, 33]),
        spec("w", Dtype::F32, &[7, 129]),
        spec("scalar", Dtype::I64, &[]),
        spec("mask", Dtype::Bool, &[5]),
        spec("empty", Dtype::F16, &[0, 4]),
    ];
    let data = write_file(&p, &specs);
    let h = read_header(&p).unwrap();
    assert_eq!(h.data_start % 8, 0);
    assert_eq!(h.metadata["format"], "pt");
    assert_eq!(h.tensors.len(), specs.len());
    for t in &h.tensors {
        assert_eq!(t.begin % t.dtype.size(), 0, "{} is not aligned", t.name);
    }
    for path in [
        PathChoice::Auto,
        PathChoice::FileStaged,
        PathChoice::Buffered,
    ] {
        let mut buf = vec![0u8; h.data_len as usize];
        let opts = CopyOptions { path, ..small() };
        let r = load_into_host(&p, &h, &mut buf, &opts).unwrap();
        assert_eq!(r.bytes, h.data_len);
        for (s, d) in specs.iter().zip(&data) {
            let t = h.tensors.iter().find(|t| t.name == s.name).unwrap();
            assert_eq!((t.dtype, &t.shape), (s.dtype, &s.shape));
            assert_eq!(&buf[t.begin as usize..t.end as usize], &d[..], "{}", s.name);
        }
    }
    // A buffer too small for the data section is refused before any read.
    let mut short = vec![0u8; 10];
    let e = load_into_host(&p, &h, &mut short, &small()).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
}

fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.safetensors");
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

fn with_header(json: &str, data: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.extend(std::iter::repeat_n(0u8, data));
    v
}

#[test]
fn hostile_files_are_refused_naming_the_file_and_the_reason() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![1, 2, 3], "shorter than the 8-byte header length"),
        (
            u64::MAX.to_le_bytes().to_vec(),
            "exceeds the 100000000-byte limit",
        ),
        (
            [100u64.to_le_bytes().as_slice(), b"{}"].concat(),
            "runs past the end of the 10-byte file",
        ),
        (with_header("{\"a\": 1", 0), "not valid JSON"),
        (
            with_header(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}}"#,
                10,
            ),
            "overlap",
        ),
        (
            with_header(
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                8,
            ),
            "run past the end of the data",
        ),
        (
            with_header(
                r#"{"a":{"dtype":"F64","shape":[4],"data_offsets":[0,16]}}"#,
                16,
            ),
            "needs 32 bytes",
        ),
    ];
    for (bytes, why) in cases {
        let (_d, p) = file_with(&bytes);
        let e = read_header(&p).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, StorageError::BadCheckpoint { .. }), "{msg}");
        assert!(msg.contains(why), "{why}: {msg}");
        assert!(
            msg.contains("bad.safetensors is not a valid safetensors checkpoint"),
            "{msg}"
        );
    }
}

#[test]
fn sharded_checkpoints_resolve_through_their_index_and_are_checked_together() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("model-00001-of-00002.safetensors");
    let b = dir.path().join("model-00002-of-00002.safetensors");
    write_file(&a, &[spec("x", Dtype::F32, &[3])]);
    write_file(
        &b,
        &[spec("y", Dtype::U8, &[9]), spec("z", Dtype::I16, &[2])],
    );
    let index = dir.path().join("model.safetensors.index.json");
    let map = serde_json::json!({"metadata": {}, "weight_map": {
        "x": a.file_name().unwrap().to_str().unwrap(),
        "y": b.file_name().unwrap().to_str().unwrap(),
        "z": b.file_name().unwrap().to_str().unwrap(),
    }});
    std::fs::write(&index, map.to_string()).unwrap();
    for p in [index.as_path(), dir.path()] {
        let ck = open_checkpoint(p).unwrap();
        let files: Vec<&Path> = ck.iter().map(|(f, _)| f.as_path()).collect();
        assert_eq!(files, [a.as_path(), b.as_path()]);
    }
    // An index naming a tensor its shard lacks.
    let wrong = serde_json::json!({"weight_map": {"x": b.file_name().unwrap().to_str().unwrap()}});
    std::fs::write(&index, wrong.to_string()).unwrap();
    let e = open_checkpoint(&index).unwrap_err().to_string();
    assert!(e.contains("weight_map puts \"x\""), "{e}");
    // Two shards with one name, found without an index.
    std::fs::remove_file(&index).unwrap();
    write_file(&b, &[spec("x", Dtype::U8, &[1])]);
    let e = open_checkpoint(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tensor \"x\" is also in"), "{e}");
}

#[test]
fn parallel_results_keep_their_order() {
    let items: Vec<u64> = (0..37).collect();
    for parallel in [0, 1, 4, 100] {
        let out = in_parallel(&items, parallel, |&x| x * x);
        assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
    }
    assert!(in_parallel(&[] as &[u8], 4, |_| 0).is_empty());
}
