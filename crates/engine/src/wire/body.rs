//! Body encoding and decoding for every [`Msg`]: little-endian fixed-width integers, length-prefixed
//! strings and byte strings, counted vectors. The reader is bounds-checked and refuses counts larger
//! than the bytes left, so a hostile body cannot make it allocate.

use super::{
    tag, BatchEntry, Hello, Msg, RemoteError, ShmOp, MAX_BATCH_ENTRIES, MAX_OPS_PER_BEGIN, MAX_STR,
};
use crate::error::{Error, Result};
use crate::region::{Access, Location, RegionDesc, RegionKey};

/// A bounds-checked little-endian reader over a body.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(Error::Malformed(format!(
                "truncated: need {n} bytes, have {}",
                self.b.len()
            )));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Error::Malformed(format!("bad bool {v}"))),
        }
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2)?
                .try_into()
                .map_err(|_| Error::Malformed("u16".into()))?,
        ))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?
                .try_into()
                .map_err(|_| Error::Malformed("u32".into()))?,
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?
                .try_into()
                .map_err(|_| Error::Malformed("u64".into()))?,
        ))
    }
    fn u128(&mut self) -> Result<u128> {
        Ok(u128::from_le_bytes(
            self.take(16)?
                .try_into()
                .map_err(|_| Error::Malformed("u128".into()))?,
        ))
    }
    fn mac(&mut self) -> Result<[u8; 32]> {
        self.take(32)?
            .try_into()
            .map_err(|_| Error::Malformed("mac".into()))
    }
    fn pake(&mut self) -> Result<[u8; 33]> {
        self.take(33)?
            .try_into()
            .map_err(|_| Error::Malformed("SPAKE2 message".into()))
    }
    fn bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u16()? as usize;
        if n > MAX_STR {
            return Err(Error::Malformed(format!("string of {n} bytes > {MAX_STR}")));
        }
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| Error::Malformed("string is not UTF-8".into()))
    }
    fn opt_string(&mut self) -> Result<Option<String>> {
        if self.bool()? {
            Ok(Some(self.string()?))
        } else {
            Ok(None)
        }
    }
    /// A count of items each at least `min_item` bytes long, checked against the bytes left so a
    /// hostile count cannot make us allocate.
    fn count(&mut self, min_item: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.b.len() {
            return Err(Error::Malformed(format!("count {n} exceeds body")));
        }
        Ok(n)
    }
    pub(crate) fn finish(&self) -> Result<()> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(Error::Malformed(format!("{} trailing bytes", self.b.len())))
        }
    }
}

fn put_u16(o: &mut Vec<u8>, v: u16) {
    o.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(o: &mut Vec<u8>, v: u32) {
    o.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(o: &mut Vec<u8>, v: u64) {
    o.extend_from_slice(&v.to_le_bytes());
}
fn put_u128(o: &mut Vec<u8>, v: u128) {
    o.extend_from_slice(&v.to_le_bytes());
}
fn put_bytes(o: &mut Vec<u8>, v: &[u8]) {
    put_u32(o, v.len() as u32);
    o.extend_from_slice(v);
}
fn put_str(o: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..s.len().min(MAX_STR)];
    put_u16(o, s.len() as u16);
    o.extend_from_slice(s);
}
fn put_opt_str(o: &mut Vec<u8>, s: &Option<String>) {
    match s {
        Some(s) => {
            o.push(1);
            put_str(o, s);
        }
        None => o.push(0),
    }
}

pub(crate) fn put_desc(o: &mut Vec<u8>, d: &RegionDesc) {
    put_u64(o, d.id);
    put_u128(o, d.key.0);
    put_u64(o, d.len);
    let (tag, n) = d.location.to_wire();
    o.push(tag);
    put_u32(o, n);
    o.push(d.access.bits());
    o.push(u8::from(d.shareable));
    put_opt_str(o, &d.name);
    // 0: no handle; 1: a handle of a whole gdx allocation (older peers); 2: a handle with the
    // region's offset in its allocation; 3: no handle, and why.
    match (&d.ipc, &d.no_ipc) {
        (None, None) => o.push(0),
        (None, Some(why)) => {
            o.push(3);
            put_str(o, why);
        }
        (Some(i), _) => {
            o.push(2);
            put_str(o, &i.host_id);
            put_u32(o, i.pid);
            put_u64(o, i.region);
            put_str(o, &i.pci_bus_id);
            put_u64(o, i.len);
            put_str(o, &i.handle);
            match i.posix_fd_alloc_len {
                None => o.push(0),
                Some(n) => {
                    o.push(1);
                    put_u64(o, n);
                }
            }
            put_u64(o, i.offset);
            put_u64(o, i.alloc_len);
            put_u32(o, i.pieces.len() as u32);
            for p in &i.pieces {
                put_u64(o, *p);
            }
        }
    }
}

pub(crate) fn get_desc(r: &mut Reader<'_>) -> Result<RegionDesc> {
    let id = r.u64()?;
    let key = RegionKey(r.u128()?);
    let len = r.u64()?;
    let tag = r.u8()?;
    let n = r.u32()?;
    let location = Location::from_wire(tag, n)?;
    let bits = r.u8()?;
    if bits > 3 {
        return Err(Error::Malformed(format!("bad access bits {bits}")));
    }
    let access = Access::from_bits(bits);
    let shareable = r.bool()?;
    let name = r.opt_string()?;
    let (ipc, no_ipc) = match r.u8()? {
        0 => (None, None),
        3 => (None, Some(r.string()?)),
        tag @ (1 | 2) => {
            let mut i = crate::desc::IpcDesc {
                host_id: r.string()?,
                pid: r.u32()?,
                region: r.u64()?,
                pci_bus_id: r.string()?,
                len: r.u64()?,
                handle: r.string()?,
                posix_fd_alloc_len: if r.bool()? { Some(r.u64()?) } else { None },
                offset: 0,
                alloc_len: 0,
                pieces: Vec::new(),
            };
            if tag == 2 {
                i.offset = r.u64()?;
                i.alloc_len = r.u64()?;
                let n = r.count(8)?;
                i.pieces = (0..n).map(|_| r.u64()).collect::<Result<_>>()?;
            }
            (Some(i), None)
        }
        t => return Err(Error::Malformed(format!("bad ipc tag {t}"))),
    };
    Ok(RegionDesc {
        id,
        key,
        len,
        location,
        access,
        shareable,
        name,
        ipc,
        no_ipc,
    })
}

/// An error travels as its [`RemoteError`] form: code, three numbers, text.
fn put_err(o: &mut Vec<u8>, e: &Error) {
    let r = RemoteError::from(e);
    put_u16(o, r.code);
    for n in r.args {
        put_u64(o, n);
    }
    put_str(o, &r.message);
}

fn get_err(r: &mut Reader<'_>) -> Result<Error> {
    let code = r.u16()?;
    let args = [r.u64()?, r.u64()?, r.u64()?];
    let message = r.string()?;
    Ok(Error::from(RemoteError {
        code,
        args,
        message,
    }))
}

/// Encodes `msg`'s body (its frame header is the caller's), by family; each family's
/// encoder matches only its own frames, and the wire_props round trip covers every one.
pub(super) fn put_body(o: &mut Vec<u8>, msg: &Msg) {
    match msg {
        Msg::Hello(_)
        | Msg::Join { .. }
        | Msg::Ok
        | Msg::ListRegions
        | Msg::Bye
        | Msg::Err(_)
        | Msg::GetRegion { .. }
        | Msg::Region(_)
        | Msg::Regions(_)
        | Msg::Notify { .. }
        | Msg::Challenge { .. }
        | Msg::Auth { .. }
        | Msg::Pake { .. }
        | Msg::PakeAuth { .. } => put_session(o, msg),
        Msg::Write { .. }
        | Msg::WriteAck { .. }
        | Msg::ReadData { .. }
        | Msg::Read { .. }
        | Msg::OpErr { .. }
        | Msg::WriteBatch { .. }
        | Msg::ReadBatch { .. }
        | Msg::WriteBatchAck { .. }
        | Msg::ReadBatchData { .. } => put_data(o, msg),
        Msg::ShmJoin { .. }
        | Msg::ShmMap { .. }
        | Msg::ShmMapped { .. }
        | Msg::ShmBegin { .. }
        | Msg::ShmBeginResult { .. }
        | Msg::ShmStaged { .. }
        | Msg::ShmEnd { .. }
        | Msg::ShmRing { .. }
        | Msg::ShmCmaGrant
        | Msg::ShmCmaProbe { .. }
        | Msg::ShmCmaRegion { .. }
        | Msg::ShmCmaAddr { .. } => put_shm(o, msg),
        Msg::RdmaConnect { .. }
        | Msg::FabricConnect { .. }
        | Msg::FabricRegion { .. }
        | Msg::FabricRegionInfo { .. }
        | Msg::RdmaRegionOn { .. }
        | Msg::RdmaRegion { .. }
        | Msg::RdmaRegionInfo { .. } => put_nic(o, msg),
    }
}

/// Encodes the control connection's frames: handshake, authentication, regions, notifications, errors.
fn put_session(o: &mut Vec<u8>, msg: &Msg) {
    match msg {
        Msg::Hello(h) => {
            put_str(o, &h.agent_name);
            put_u128(o, h.agent_id);
            put_u128(o, h.host_id);
            put_u32(o, h.transports);
            put_opt_str(o, &h.shm_socket);
            put_opt_str(o, &h.listen);
            put_u128(o, h.session);
            put_u128(o, h.token);
            put_u16(o, h.streams);
            put_u128(o, h.nonce);
            put_str(o, &h.cluster);
        }
        Msg::Join {
            session,
            token,
            stream,
            nonce,
        } => {
            put_u128(o, *session);
            put_u128(o, *token);
            put_u16(o, *stream);
            put_u128(o, *nonce);
        }
        Msg::Ok | Msg::ListRegions | Msg::Bye => {}
        Msg::Err(e) => put_err(o, e),
        Msg::GetRegion { name } => put_str(o, name),
        Msg::Region(d) => put_desc(o, d),
        Msg::Regions(ds) => {
            put_u32(o, ds.len() as u32);
            ds.iter().for_each(|d| put_desc(o, d));
        }
        Msg::Notify { xfer, data } => {
            put_u64(o, *xfer);
            put_bytes(o, data);
        }
        Msg::Challenge { nonce, mac } => {
            put_u128(o, *nonce);
            o.extend_from_slice(mac);
        }
        Msg::Auth { mac } => o.extend_from_slice(mac),
        Msg::Pake { nonce, msg } => {
            put_u128(o, *nonce);
            o.extend_from_slice(msg);
        }
        Msg::PakeAuth { msg, mac } => {
            o.extend_from_slice(msg);
            o.extend_from_slice(mac);
        }
        // put_body routes only these frames here.
        _ => {}
    }
}

/// Encodes a tcp data stream's frames: single ops and batches, with their acks.
fn put_data(o: &mut Vec<u8>, msg: &Msg) {
    match msg {
        Msg::Write {
            xfer,
            op,
            chunk,
            region,
            key,
            offset,
        } => {
            put_u64(o, *xfer);
            put_u32(o, *op);
            put_u32(o, *chunk);
            put_u64(o, *region);
            put_u128(o, key.0);
            put_u64(o, *offset);
        }
        Msg::WriteAck { xfer, op, chunk } | Msg::ReadData { xfer, op, chunk } => {
            put_u64(o, *xfer);
            put_u32(o, *op);
            put_u32(o, *chunk);
        }
        Msg::Read {
            xfer,
            op,
            chunk,
            region,
            key,
            offset,
            len,
        } => {
            put_u64(o, *xfer);
            put_u32(o, *op);
            put_u32(o, *chunk);
            put_u64(o, *region);
            put_u128(o, key.0);
            put_u64(o, *offset);
            put_u32(o, *len);
        }
        Msg::OpErr {
            xfer,
            op,
            chunk,
            err,
        } => {
            put_u64(o, *xfer);
            put_u32(o, *op);
            put_u32(o, *chunk);
            put_err(o, err);
        }
        Msg::WriteBatch { xfer, entries } | Msg::ReadBatch { xfer, entries } => {
            put_u64(o, *xfer);
            put_u32(o, entries.len() as u32);
            for e in entries {
                put_u32(o, e.op);
                put_u32(o, e.chunk);
                put_u64(o, e.region);
                put_u128(o, e.key.0);
                put_u64(o, e.offset);
                put_u32(o, e.len);
            }
        }
        Msg::WriteBatchAck { xfer, errors } | Msg::ReadBatchData { xfer, errors } => {
            put_u64(o, *xfer);
            put_u32(o, errors.len() as u32);
            for (i, e) in errors {
                put_u32(o, *i);
                put_err(o, e);
            }
        }
        // put_body routes only these frames here.
        _ => {}
    }
}

/// Encodes the shm connection's frames: join, mapping, begin/staged/end, the ring, cma.
fn put_shm(o: &mut Vec<u8>, msg: &Msg) {
    match msg {
        Msg::ShmJoin {
            session,
            token,
            nonce,
        } => {
            put_u128(o, *session);
            put_u128(o, *token);
            put_u128(o, *nonce);
        }
        Msg::ShmMap {
            region,
            key,
            write,
            piece,
        } => {
            put_u64(o, *region);
            put_u128(o, key.0);
            o.push(u8::from(*write));
            put_u32(o, *piece);
        }
        Msg::ShmMapped { len, writable } => {
            put_u64(o, *len);
            o.push(u8::from(*writable));
        }
        Msg::ShmBegin { xfer, ops } => {
            put_u64(o, *xfer);
            put_u32(o, ops.len() as u32);
            for op in ops {
                o.push(u8::from(op.write));
                put_u64(o, op.region);
                put_u128(o, op.key.0);
                put_u64(o, op.offset);
                put_u64(o, op.len);
            }
        }
        Msg::ShmBeginResult { errors } => {
            put_u32(o, errors.len() as u32);
            for (i, e) in errors {
                put_u32(o, *i);
                put_err(o, e);
            }
        }
        Msg::ShmStaged {
            xfer,
            op,
            write,
            region,
            key,
            offset,
            len,
        } => {
            put_u64(o, *xfer);
            put_u32(o, *op);
            o.push(u8::from(*write));
            put_u64(o, *region);
            put_u128(o, key.0);
            put_u64(o, *offset);
            put_u64(o, *len);
        }
        Msg::ShmEnd { xfer, notify } => {
            put_u64(o, *xfer);
            match notify {
                Some(d) => {
                    o.push(1);
                    put_bytes(o, d);
                }
                None => o.push(0),
            }
        }
        Msg::ShmRing { slots, slot_bytes } => {
            put_u32(o, *slots);
            put_u32(o, *slot_bytes);
        }
        Msg::ShmCmaGrant => {}
        Msg::ShmCmaProbe { addr, value } => {
            put_u64(o, *addr);
            put_u128(o, *value);
        }
        Msg::ShmCmaRegion { region, key, write } => {
            put_u64(o, *region);
            put_u128(o, key.0);
            o.push(u8::from(*write));
        }
        Msg::ShmCmaAddr {
            addr,
            len,
            writable,
        } => {
            put_u64(o, *addr);
            put_u64(o, *len);
            o.push(u8::from(*writable));
        }
        // put_body routes only these frames here.
        _ => {}
    }
}

/// Encodes the rdma and fabric set-up frames: connection data and region registrations.
fn put_nic(o: &mut Vec<u8>, msg: &Msg) {
    match msg {
        Msg::RdmaConnect { data } => put_bytes(o, data),
        Msg::FabricConnect { addr } => put_bytes(o, addr),
        Msg::FabricRegion { region, key } => {
            put_u64(o, *region);
            put_u128(o, key.0);
        }
        Msg::FabricRegionInfo { addr, len, mr_key } => {
            put_u64(o, *addr);
            put_u64(o, *len);
            put_u64(o, *mr_key);
        }
        Msg::RdmaRegionOn {
            region,
            key,
            device,
        } => {
            put_u64(o, *region);
            put_u128(o, key.0);
            put_str(o, device);
        }
        Msg::RdmaRegion { region, key, write } => {
            put_u64(o, *region);
            put_u128(o, key.0);
            o.push(u8::from(*write));
        }
        Msg::RdmaRegionInfo {
            addr,
            len,
            rkey,
            mechanism,
        } => {
            put_u64(o, *addr);
            put_u64(o, *len);
            put_u32(o, *rkey);
            put_str(o, mechanism);
        }
        // put_body routes only these frames here.
        _ => {}
    }
}

/// Decodes the body of a frame of type `kind`. Rejects truncated bodies and trailing bytes.
pub fn decode_body(kind: u8, body: &[u8]) -> Result<Msg> {
    let mut r = Reader::new(body);
    let msg = match kind {
        tag::HELLO
        | tag::JOIN
        | tag::OK
        | tag::LIST_REGIONS
        | tag::BYE
        | tag::ERR
        | tag::GET_REGION
        | tag::REGION
        | tag::REGIONS
        | tag::NOTIFY
        | tag::CHALLENGE
        | tag::AUTH
        | tag::PAKE
        | tag::PAKE_AUTH => decode_session(kind, &mut r)?,
        tag::WRITE
        | tag::WRITE_ACK
        | tag::READ_DATA
        | tag::READ
        | tag::OP_ERR
        | tag::WRITE_BATCH
        | tag::READ_BATCH
        | tag::WRITE_BATCH_ACK
        | tag::READ_BATCH_DATA => decode_data(kind, &mut r)?,
        tag::SHM_JOIN
        | tag::SHM_MAP
        | tag::SHM_MAPPED
        | tag::SHM_BEGIN
        | tag::SHM_BEGIN_RESULT
        | tag::SHM_STAGED
        | tag::SHM_END
        | tag::SHM_RING
        | tag::SHM_CMA_GRANT
        | tag::SHM_CMA_PROBE
        | tag::SHM_CMA_REGION
        | tag::SHM_CMA_ADDR => decode_shm(kind, &mut r)?,
        tag::RDMA_CONNECT
        | tag::FABRIC_CONNECT
        | tag::FABRIC_REGION
        | tag::FABRIC_REGION_INFO
        | tag::RDMA_REGION_ON
        | tag::RDMA_REGION
        | tag::RDMA_REGION_INFO => decode_nic(kind, &mut r)?,
        k => return Err(Error::UnknownFrame(k)),
    };
    r.finish()?;
    Ok(msg)
}

/// Decodes the control connection's frames: handshake, authentication, regions, notifications, errors.
fn decode_session(kind: u8, r: &mut Reader<'_>) -> Result<Msg> {
    Ok(match kind {
        tag::HELLO => Msg::Hello(Hello {
            agent_name: r.string()?,
            agent_id: r.u128()?,
            host_id: r.u128()?,
            transports: r.u32()?,
            shm_socket: r.opt_string()?,
            listen: r.opt_string()?,
            session: r.u128()?,
            token: r.u128()?,
            streams: r.u16()?,
            nonce: r.u128()?,
            cluster: r.string()?,
        }),
        tag::JOIN => Msg::Join {
            session: r.u128()?,
            token: r.u128()?,
            stream: r.u16()?,
            nonce: r.u128()?,
        },
        tag::OK => Msg::Ok,
        tag::ERR => Msg::Err(get_err(r)?),
        tag::GET_REGION => Msg::GetRegion { name: r.string()? },
        tag::REGION => Msg::Region(get_desc(r)?),
        tag::LIST_REGIONS => Msg::ListRegions,
        tag::REGIONS => {
            let n = r.count(39)?;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(get_desc(r)?);
            }
            Msg::Regions(v)
        }
        tag::NOTIFY => Msg::Notify {
            xfer: r.u64()?,
            data: r.bytes()?,
        },
        tag::BYE => Msg::Bye,
        tag::CHALLENGE => Msg::Challenge {
            nonce: r.u128()?,
            mac: r.mac()?,
        },
        tag::AUTH => Msg::Auth { mac: r.mac()? },
        tag::PAKE => Msg::Pake {
            nonce: r.u128()?,
            msg: r.pake()?,
        },
        tag::PAKE_AUTH => Msg::PakeAuth {
            msg: r.pake()?,
            mac: r.mac()?,
        },
        k => return Err(Error::UnknownFrame(k)),
    })
}

/// Decodes a tcp data stream's frames: single ops and batches, with their acks.
fn decode_data(kind: u8, r: &mut Reader<'_>) -> Result<Msg> {
    Ok(match kind {
        tag::WRITE => Msg::Write {
            xfer: r.u64()?,
            op: r.u32()?,
            chunk: r.u32()?,
            region: r.u64()?,
            key: RegionKey(r.u128()?),
            offset: r.u64()?,
        },
        tag::WRITE_ACK => Msg::WriteAck {
            xfer: r.u64()?,
            op: r.u32()?,
            chunk: r.u32()?,
        },
        tag::READ => Msg::Read {
            xfer: r.u64()?,
            op: r.u32()?,
            chunk: r.u32()?,
            region: r.u64()?,
            key: RegionKey(r.u128()?),
            offset: r.u64()?,
            len: r.u32()?,
        },
        tag::READ_DATA => Msg::ReadData {
            xfer: r.u64()?,
            op: r.u32()?,
            chunk: r.u32()?,
        },
        tag::OP_ERR => Msg::OpErr {
            xfer: r.u64()?,
            op: r.u32()?,
            chunk: r.u32()?,
            err: get_err(r)?,
        },
        tag::WRITE_BATCH | tag::READ_BATCH => {
            let xfer = r.u64()?;
            let n = r.count(44)?;
            if n > MAX_BATCH_ENTRIES {
                return Err(Error::Malformed(format!(
                    "a batch of {n} entries > {MAX_BATCH_ENTRIES}"
                )));
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(BatchEntry {
                    op: r.u32()?,
                    chunk: r.u32()?,
                    region: r.u64()?,
                    key: RegionKey(r.u128()?),
                    offset: r.u64()?,
                    len: r.u32()?,
                });
            }
            if kind == tag::WRITE_BATCH {
                Msg::WriteBatch { xfer, entries }
            } else {
                Msg::ReadBatch { xfer, entries }
            }
        }
        tag::WRITE_BATCH_ACK | tag::READ_BATCH_DATA => {
            let xfer = r.u64()?;
            let n = r.count(32)?;
            if n > MAX_BATCH_ENTRIES {
                return Err(Error::Malformed(format!(
                    "a batch answer with {n} errors > {MAX_BATCH_ENTRIES}"
                )));
            }
            let mut errors = Vec::with_capacity(n);
            for _ in 0..n {
                errors.push((r.u32()?, get_err(r)?));
            }
            if kind == tag::WRITE_BATCH_ACK {
                Msg::WriteBatchAck { xfer, errors }
            } else {
                Msg::ReadBatchData { xfer, errors }
            }
        }
        k => return Err(Error::UnknownFrame(k)),
    })
}

/// Decodes the shm connection's frames: join, mapping, begin/staged/end, the ring, cma.
fn decode_shm(kind: u8, r: &mut Reader<'_>) -> Result<Msg> {
    Ok(match kind {
        tag::SHM_JOIN => Msg::ShmJoin {
            session: r.u128()?,
            token: r.u128()?,
            nonce: r.u128()?,
        },
        tag::SHM_MAP => Msg::ShmMap {
            region: r.u64()?,
            key: RegionKey(r.u128()?),
            write: r.bool()?,
            piece: r.u32()?,
        },
        tag::SHM_MAPPED => Msg::ShmMapped {
            len: r.u64()?,
            writable: r.bool()?,
        },
        tag::SHM_BEGIN => {
            let xfer = r.u64()?;
            let n = r.count(41)?;
            if n > MAX_OPS_PER_BEGIN {
                return Err(Error::Malformed(format!(
                    "ShmBegin with {n} ops > {MAX_OPS_PER_BEGIN}"
                )));
            }
            let mut ops = Vec::with_capacity(n);
            for _ in 0..n {
                ops.push(ShmOp {
                    write: r.bool()?,
                    region: r.u64()?,
                    key: RegionKey(r.u128()?),
                    offset: r.u64()?,
                    len: r.u64()?,
                });
            }
            Msg::ShmBegin { xfer, ops }
        }
        tag::SHM_BEGIN_RESULT => {
            let n = r.count(32)?;
            if n > MAX_OPS_PER_BEGIN {
                return Err(Error::Malformed(format!(
                    "ShmBeginResult with {n} errors > {MAX_OPS_PER_BEGIN}"
                )));
            }
            let mut errors = Vec::with_capacity(n);
            for _ in 0..n {
                errors.push((r.u32()?, get_err(r)?));
            }
            Msg::ShmBeginResult { errors }
        }
        tag::SHM_STAGED => Msg::ShmStaged {
            xfer: r.u64()?,
            op: r.u32()?,
            write: r.bool()?,
            region: r.u64()?,
            key: RegionKey(r.u128()?),
            offset: r.u64()?,
            len: r.u64()?,
        },
        tag::SHM_END => {
            let xfer = r.u64()?;
            let notify = if r.bool()? { Some(r.bytes()?) } else { None };
            Msg::ShmEnd { xfer, notify }
        }
        tag::SHM_RING => Msg::ShmRing {
            slots: r.u32()?,
            slot_bytes: r.u32()?,
        },
        tag::SHM_CMA_GRANT => Msg::ShmCmaGrant,
        tag::SHM_CMA_PROBE => Msg::ShmCmaProbe {
            addr: r.u64()?,
            value: r.u128()?,
        },
        tag::SHM_CMA_REGION => Msg::ShmCmaRegion {
            region: r.u64()?,
            key: RegionKey(r.u128()?),
            write: r.bool()?,
        },
        tag::SHM_CMA_ADDR => Msg::ShmCmaAddr {
            addr: r.u64()?,
            len: r.u64()?,
            writable: r.bool()?,
        },
        k => return Err(Error::UnknownFrame(k)),
    })
}

/// Decodes the rdma and fabric set-up frames: connection data and region registrations.
fn decode_nic(kind: u8, r: &mut Reader<'_>) -> Result<Msg> {
    Ok(match kind {
        tag::RDMA_CONNECT => Msg::RdmaConnect { data: r.bytes()? },
        tag::RDMA_REGION => Msg::RdmaRegion {
            region: r.u64()?,
            key: RegionKey(r.u128()?),
            write: r.bool()?,
        },
        tag::RDMA_REGION_INFO => Msg::RdmaRegionInfo {
            addr: r.u64()?,
            len: r.u64()?,
            rkey: r.u32()?,
            mechanism: r.string()?,
        },
        tag::FABRIC_CONNECT => Msg::FabricConnect { addr: r.bytes()? },
        tag::FABRIC_REGION => Msg::FabricRegion {
            region: r.u64()?,
            key: RegionKey(r.u128()?),
        },
        tag::FABRIC_REGION_INFO => Msg::FabricRegionInfo {
            addr: r.u64()?,
            len: r.u64()?,
            mr_key: r.u64()?,
        },
        tag::RDMA_REGION_ON => Msg::RdmaRegionOn {
            region: r.u64()?,
            key: RegionKey(r.u128()?),
            device: r.string()?,
        },
        k => return Err(Error::UnknownFrame(k)),
    })
}
