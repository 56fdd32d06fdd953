//! zstd with a table's dictionary, through zstd's C interface: the
//! dictionary digests (dict.rs holds them) and bare zstd blocks.
//!
//! A record compressed with a dictionary is stored as one zstd block
//! (`Codec::ZstdBlock`): no frame header, no block header. The block
//! starts from the dictionary's entropy tables, so it can reuse them
//! instead of describing its own, which is what makes records of a few
//! dozen bytes shrink. Each record is a block sequence of its own (every
//! compression and decompression begins afresh from the dictionary), so
//! no block depends on another record. The record header carries what a
//! frame would (the raw length, the dictionary's id).
//!
//! zstd-safe has no way to begin a block sequence from a digest, hence
//! the C calls here; the contexts are per thread, like compress.rs's.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use zstd::zstd_safe::zstd_sys as sys;

/// The most input one block takes.
pub const BLOCK_MAX: usize = sys::ZSTD_BLOCKSIZE_MAX as usize;

fn failed(code: usize) -> bool {
    // SAFETY: ZSTD_isError only looks at the number.
    unsafe { sys::ZSTD_isError(code) != 0 }
}

/// Where a dictionary's content starts: after its header (magic, id and
/// entropy tables) in zstd's format, at 0 in bytes of raw content.
pub fn content_start(bytes: &[u8]) -> usize {
    // SAFETY: `bytes` is valid for its length; zstd only reads it.
    let n = unsafe { sys::ZDICT_getDictHeaderSize(bytes.as_ptr().cast(), bytes.len()) };
    if failed(n) {
        0
    } else {
        n.min(bytes.len())
    }
}

/// Trains a dictionary of at most `capacity` bytes on `samples` (laid end
/// to end, their lengths in `sizes`) the way `ZDICT_trainFromBuffer` does
/// (fastCover, d = 8, 4 steps over the segment size k), but made for
/// compressing at `level`, not zstd's default 3: the k it keeps and the
/// entropy tables it writes are those that compress its held-out quarter
/// of the samples best at that level (docs/term-format.md,
/// "Dictionaries"). Its bytes, or zstd's reason.
pub fn train(
    samples: &[u8],
    sizes: &[usize],
    capacity: usize,
    level: i32,
) -> Result<Vec<u8>, &'static str> {
    let count = u32::try_from(sizes.len()).map_err(|_| "too many samples")?;
    if sizes.iter().sum::<usize>() != samples.len() {
        return Err("sample sizes do not add up");
    }
    // SAFETY: a plain C struct of numbers, for which all zeros is zstd's
    // "default" for every field.
    let mut params: sys::ZDICT_fastCover_params_t = unsafe { std::mem::zeroed() };
    params.d = 8;
    params.steps = 4;
    params.nbThreads = 1;
    params.zParams.compressionLevel = level;
    let mut dict = vec![0u8; capacity];
    // SAFETY: `dict` has room for `capacity` bytes, `samples` holds the
    // `count` samples whose lengths `sizes` gives (checked above), and
    // `params` is a valid parameter block zstd may write its choice into.
    let n = unsafe {
        sys::ZDICT_optimizeTrainFromBuffer_fastCover(
            dict.as_mut_ptr().cast(),
            capacity,
            samples.as_ptr().cast(),
            sizes.as_ptr(),
            count,
            &mut params,
        )
    };
    if failed(n) {
        return Err(zstd::zstd_safe::get_error_name(n));
    }
    dict.truncate(n);
    Ok(dict)
}

/// The record size a digest's match tables are sized for, beside the
/// dictionary ([`CDigest::new`]).
const DIGEST_RECORD: usize = 16 * 1024;
/// The smallest match tables a digest gets: 2^12 entries.
const MIN_TABLE_LOG: u32 = 12;

/// A dictionary digested for compressing at one level.
pub struct CDigest(NonNull<sys::ZSTD_CDict>);

/// A dictionary digested for decompressing.
pub struct DDigest(NonNull<sys::ZSTD_DDict>);

// SAFETY: a digest is never changed once made (zstd only reads it while
// compressing or decompressing: "a CDict can be shared by multiple
// threads concurrently, since its usage is read-only"), and it is freed
// only by its Drop.
unsafe impl Send for CDigest {}
// SAFETY: as above.
unsafe impl Sync for CDigest {}
// SAFETY: as above, for DDicts.
unsafe impl Send for DDigest {}
// SAFETY: as above.
unsafe impl Sync for DDigest {}

impl CDigest {
    /// Digests `bytes` (copied) for `level`; `None` if zstd refuses them.
    /// The digest's match tables are zstd's for that level and dictionary
    /// size, but with no more entries than the dictionary and a record of
    /// [`DIGEST_RECORD`] bytes have positions: zstd sizes them for inputs
    /// of any length (at level 9, 2^16 hash entries, 351 KiB of digest for
    /// a 16 KiB dictionary; 2^15 makes it 191 KiB and stored 0.1% more
    /// bytes of `mix bench`'s JSON-like records).
    pub fn new(bytes: &[u8], level: i32) -> Option<CDigest> {
        let log = (bytes.len() + DIGEST_RECORD)
            .next_power_of_two()
            .trailing_zeros()
            .max(MIN_TABLE_LOG);
        // SAFETY: a plain function of three numbers.
        let mut params = unsafe { sys::ZSTD_getCParams(level, 0, bytes.len()) };
        params.hashLog = params.hashLog.min(log);
        params.chainLog = params.chainLog.min(log);
        let malloc = sys::ZSTD_customMem {
            customAlloc: None,
            customFree: None,
            opaque: std::ptr::null_mut(),
        };
        // SAFETY: `bytes` is valid for its length and zstd copies it
        // (`ZSTD_dlm_byCopy`); `params` are zstd's own, narrowed within
        // their bounds (ZSTD_HASHLOG_MIN is 6); no custom allocator.
        let p = unsafe {
            sys::ZSTD_createCDict_advanced(
                bytes.as_ptr().cast(),
                bytes.len(),
                sys::ZSTD_dictLoadMethod_e::ZSTD_dlm_byCopy,
                sys::ZSTD_dictContentType_e::ZSTD_dct_auto,
                params,
                malloc,
            )
        };
        NonNull::new(p).map(CDigest)
    }

    /// Bytes of memory it takes.
    pub fn sizeof(&self) -> usize {
        // SAFETY: a live digest.
        unsafe { sys::ZSTD_sizeof_CDict(self.0.as_ptr()) }
    }
}

impl Drop for CDigest {
    fn drop(&mut self) {
        // SAFETY: made by ZSTD_createCDict, freed once. A per-thread
        // context may still point at it from its last block, but every
        // use of a context begins by attaching the digest it uses.
        unsafe { sys::ZSTD_freeCDict(self.0.as_ptr()) };
    }
}

impl DDigest {
    /// Digests `bytes` (copied); `None` if zstd refuses them (a damaged
    /// dictionary whose entropy tables do not parse).
    pub fn new(bytes: &[u8]) -> Option<DDigest> {
        // SAFETY: `bytes` is valid for its length; zstd copies it.
        let p = unsafe { sys::ZSTD_createDDict(bytes.as_ptr().cast(), bytes.len()) };
        NonNull::new(p).map(DDigest)
    }

    /// Bytes of memory it takes.
    pub fn sizeof(&self) -> usize {
        // SAFETY: a live digest.
        unsafe { sys::ZSTD_sizeof_DDict(self.0.as_ptr()) }
    }
}

impl Drop for DDigest {
    fn drop(&mut self) {
        // SAFETY: made by ZSTD_createDDict, freed once (see CDigest's).
        unsafe { sys::ZSTD_freeDDict(self.0.as_ptr()) };
    }
}

struct CCtx(NonNull<sys::ZSTD_CCtx>);
struct DCtx(NonNull<sys::ZSTD_DCtx>);

impl Drop for CCtx {
    fn drop(&mut self) {
        // SAFETY: made by ZSTD_createCCtx, freed once.
        unsafe { sys::ZSTD_freeCCtx(self.0.as_ptr()) };
    }
}

impl Drop for DCtx {
    fn drop(&mut self) {
        // SAFETY: made by ZSTD_createDCtx, freed once.
        unsafe { sys::ZSTD_freeDCtx(self.0.as_ptr()) };
    }
}

thread_local! {
    static C: RefCell<Option<CCtx>> = const { RefCell::new(None) };
    static D: RefCell<Option<DCtx>> = const { RefCell::new(None) };
}

fn new_cctx() -> Option<CCtx> {
    // SAFETY: plain constructor.
    NonNull::new(unsafe { sys::ZSTD_createCCtx() }).map(CCtx)
}

fn new_dctx() -> Option<DCtx> {
    // SAFETY: plain constructor.
    let d = DCtx(NonNull::new(unsafe { sys::ZSTD_createDCtx() })?);
    // Frames (the older `Codec::ZstdDict`) are magicless.
    let magicless = sys::ZSTD_format_e::ZSTD_f_zstd1_magicless as c_int;
    // SAFETY: a live context; ZSTD_d_format is experimentalParam1.
    let r = unsafe {
        sys::ZSTD_DCtx_setParameter(
            d.0.as_ptr(),
            sys::ZSTD_dParameter::ZSTD_d_experimentalParam1,
            magicless,
        )
    };
    (!failed(r)).then_some(d)
}

/// Compresses `raw` into `out` (cleared first) as one block begun from
/// `dict`; the block's length, or `None` where zstd finds it not
/// compressible, `raw` is longer than a block, or zstd fails.
pub fn compress(raw: &[u8], dict: &CDigest, out: &mut Vec<u8>) -> Option<usize> {
    out.clear();
    if raw.is_empty() || raw.len() > BLOCK_MAX {
        return None;
    }
    let cap = zstd::zstd_safe::compress_bound(raw.len());
    out.reserve(cap);
    C.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = new_cctx();
        }
        let c = slot.as_ref()?.0.as_ptr();
        // SAFETY: `c` and `dict` are live. Beginning from the digest
        // resets the context: nothing of an earlier block (whose source
        // may be gone) is used. The block's source `raw` is only read
        // during ZSTD_compressBlock, and the next use of this context
        // begins afresh again. `out` has room for `cap` bytes, which zstd
        // never writes past; it wrote the length it returns.
        let n = unsafe {
            // The source's size lets zstd size its window for it (the
            // digest's own window is sized for small inputs).
            let none = sys::ZSTD_frameParameters {
                contentSizeFlag: 0,
                checksumFlag: 0,
                noDictIDFlag: 1,
            };
            let size = raw.len() as u64;
            let r = sys::ZSTD_compressBegin_usingCDict_advanced(c, dict.0.as_ptr(), none, size);
            if failed(r) || raw.len() > sys::ZSTD_getBlockSize(c) {
                None
            } else {
                let n = sys::ZSTD_compressBlock(
                    c,
                    out.as_mut_ptr().cast::<c_void>(),
                    cap,
                    raw.as_ptr().cast(),
                    raw.len(),
                );
                if failed(n) {
                    *slot = None;
                    None
                } else {
                    out.set_len(n);
                    Some(n)
                }
            }
        };
        n.filter(|&n| n > 0)
    })
}

/// Which kind of stored body [`decompress`] reads.
#[derive(Clone, Copy)]
pub enum Form {
    /// A bare block ([`compress`]).
    Block,
    /// A magicless frame without sizes or checksum.
    Frame,
}

/// Decompresses `stored` (made with `dict`, as `form`) into `out`, which
/// must come out exactly `raw_len` bytes long; false if it does not or
/// zstd refuses the input.
pub fn decompress(
    stored: &[u8],
    dict: &DDigest,
    form: Form,
    raw_len: usize,
    out: &mut Vec<u8>,
) -> bool {
    out.clear();
    if matches!(form, Form::Block) && (stored.is_empty() || raw_len == 0 || raw_len > BLOCK_MAX) {
        return false;
    }
    out.reserve_exact(raw_len);
    D.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = new_dctx();
        }
        let Some(d) = slot.as_ref().map(|d| d.0.as_ptr()) else {
            return false;
        };
        let (dst, src) = (out.as_mut_ptr().cast::<c_void>(), stored.as_ptr().cast());
        // SAFETY: `d` and `dict` are live; `out` has room for `raw_len`
        // bytes, which zstd never writes past (input needing more is an
        // error), and it wrote the length it returns. Both calls begin
        // afresh from the digest: nothing of an earlier record is used.
        // zstd's decoders check their input: a damaged body is an error
        // or decodes to some bytes, never a read out of bounds.
        let n = unsafe {
            match form {
                Form::Block => {
                    let r = sys::ZSTD_decompressBegin_usingDDict(d, dict.0.as_ptr());
                    if failed(r) {
                        r
                    } else {
                        sys::ZSTD_decompressBlock(d, dst, raw_len, src, stored.len())
                    }
                }
                Form::Frame => sys::ZSTD_decompress_usingDDict(
                    d,
                    dst,
                    raw_len,
                    src,
                    stored.len(),
                    dict.0.as_ptr(),
                ),
            }
        };
        if failed(n) {
            *slot = None;
            return false;
        }
        // SAFETY: zstd wrote `n` <= raw_len (the capacity) bytes.
        unsafe { out.set_len(n) };
        n == raw_len
    })
}
