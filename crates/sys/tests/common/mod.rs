//! What the GPU test binaries share.

use gdx_base::pattern::{fill_pattern, find_mismatch, POISON};
use gdx_sys::cuda::{Context, DeviceBuffer, PinnedHostBuffer, Stream};

/// Uploads the pattern of `seed` into `src` (`len` bytes, on `ctx`'s GPU, through
/// `stream`), poisons `dst` (on `peer`'s GPU), copies `src` to `dst` GPU to GPU on `stream`, and
/// reads `dst` back on a stream of the peer GPU (ordered after the copy by dst's marker):
/// asserts the pattern came back. Returns that pinned buffer and the peer's stream.
pub fn verified_peer_copy(
    ctx: &Context,
    peer: &Context,
    stream: &Stream,
    src: &mut DeviceBuffer,
    dst: &mut DeviceBuffer,
    len: usize,
    seed: u64,
) -> (PinnedHostBuffer, Stream) {
    let mut host = PinnedHostBuffer::new(ctx, len).unwrap();
    fill_pattern(host.as_mut_slice().unwrap(), seed);
    stream.copy_to_device(src, &host).unwrap();
    stream.memset(dst, 0, len, POISON).unwrap();
    stream.copy_peer(dst, 0, src, 0, len).unwrap();
    host.as_mut_slice().unwrap().fill(0);
    let peer_stream = Stream::new(peer).unwrap();
    peer_stream.copy_to_host(&mut host, dst).unwrap();
    assert_eq!(find_mismatch(host.as_slice().unwrap(), seed), None);
    (host, peer_stream)
}
