//! The first bytes of a CONNECT tunnel: a TLS ClientHello, and its server
//! name (SNI). A minimal, bounded parser of bytes from inside: records of
//! type handshake, reassembled up to [`MAX_HELLO`], the ClientHello's fixed
//! fields skipped, its extensions walked for `server_name`. Anything else
//! (another protocol, no SNI, two names, an encrypted ClientHello, which
//! hides the real name) is refused.

/// Largest ClientHello accepted (handshake message bytes).
pub const MAX_HELLO: usize = 16 * 1024;
/// Most bytes read from the client before the ClientHello is whole.
pub const MAX_BYTES: usize = MAX_HELLO + 4 * 5 + 4;

/// What the bytes so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not enough bytes yet.
    More,
    /// A whole ClientHello; its server name, canonical.
    Sni(String),
    /// Not a ClientHello this proxy passes, and why.
    Refused(String),
}

/// Parses the start of a tunnel's client bytes.
pub fn parse(buf: &[u8]) -> Hello {
    let mut hs: Vec<u8> = Vec::new();
    let mut pos = 0;
    loop {
        let Some(head) = buf.get(pos..pos + 5) else {
            return more(buf);
        };
        if head[0] != 22 {
            return Hello::Refused(
                "not a TLS handshake (the tunnel must start with a ClientHello)".into(),
            );
        }
        if head[1] != 3 {
            return Hello::Refused("not a TLS record version".into());
        }
        let len = u16::from_be_bytes([head[3], head[4]]) as usize;
        if len == 0 || len > 16 * 1024 {
            return Hello::Refused(format!("TLS record of {len} bytes"));
        }
        let Some(frag) = buf.get(pos + 5..pos + 5 + len) else {
            return more(buf);
        };
        hs.extend_from_slice(frag);
        pos += 5 + len;
        if hs.len() < 4 {
            continue;
        }
        if hs[0] != 1 {
            return Hello::Refused("the first handshake message is not a ClientHello".into());
        }
        let need = 4 + (u32::from_be_bytes([0, hs[1], hs[2], hs[3]]) as usize);
        if need > MAX_HELLO {
            return Hello::Refused(format!("ClientHello of {need} bytes (at most {MAX_HELLO})"));
        }
        if hs.len() >= need {
            return match body(&hs[4..need]) {
                Ok(name) => Hello::Sni(name),
                Err(e) => Hello::Refused(e.to_string()),
            };
        }
    }
}

fn more(buf: &[u8]) -> Hello {
    if buf.len() >= MAX_BYTES {
        Hello::Refused(format!("no whole ClientHello in {MAX_BYTES} bytes"))
    } else {
        Hello::More
    }
}

/// Why a ClientHello's body names no one server (a refusal's reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// It ends inside a field.
    #[error("truncated ClientHello")]
    Truncated,
    /// Its session id is longer than TLS allows.
    #[error("session id over 32 bytes")]
    SessionId,
    /// It has no extensions.
    #[error("a ClientHello without extensions has no server name")]
    NoExtensions,
    /// Two `server_name` extensions.
    #[error("two server_name extensions")]
    TwoExtensions,
    /// Encrypted Client Hello.
    #[error("an encrypted ClientHello (ECH) hides the server name")]
    Ech,
    /// The ESNI draft.
    #[error("encrypted SNI (the ESNI draft) hides the server name")]
    Esni,
    /// No `server_name` extension.
    #[error("the ClientHello has no server name (SNI)")]
    NoSni,
    /// Two host names in the extension.
    #[error("two host names in server_name")]
    TwoNames,
    /// The name is not UTF-8.
    #[error("the server name is not text")]
    NotText,
    /// The name is not one the allowlist could hold.
    #[error("server name: {0}")]
    Name(super::name::NameError),
    /// The extension holds no host name.
    #[error("server_name without a host name")]
    NoName,
}

/// A cursor over bytes that never reads past their end.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BodyError> {
        if n > self.0.len() {
            return Err(BodyError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<usize, BodyError> {
        Ok(self.take(1)?[0] as usize)
    }
    fn u16(&mut self) -> Result<usize, BodyError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    fn vec8(&mut self) -> Result<&'a [u8], BodyError> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Result<&'a [u8], BodyError> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The ClientHello's body (after type and length): its one server name.
fn body(b: &[u8]) -> Result<String, BodyError> {
    let mut c = Cur(b);
    c.take(2 + 32)?; // legacy_version, random
    if c.vec8()?.len() > 32 {
        return Err(BodyError::SessionId);
    }
    c.vec16()?; // cipher suites
    c.vec8()?; // compression methods
    if c.0.is_empty() {
        return Err(BodyError::NoExtensions);
    }
    let mut exts = Cur(c.vec16()?);
    let mut name = None;
    while !exts.0.is_empty() {
        let typ = exts.u16()?;
        let data = exts.vec16()?;
        match typ {
            0 if name.is_some() => return Err(BodyError::TwoExtensions),
            0 => name = Some(server_name(data)?),
            0xfe0d => return Err(BodyError::Ech),
            0xffce => return Err(BodyError::Esni),
            _ => {}
        }
    }
    name.ok_or(BodyError::NoSni)
}

/// The `server_name` extension's one host name, canonical.
fn server_name(data: &[u8]) -> Result<String, BodyError> {
    let mut outer = Cur(data);
    let mut list = Cur(outer.vec16()?);
    let mut found = None;
    while !list.0.is_empty() {
        let typ = list.u8()?;
        let n = list.vec16()?;
        if typ != 0 {
            continue;
        }
        if found.is_some() {
            return Err(BodyError::TwoNames);
        }
        let s = std::str::from_utf8(n).map_err(|_| BodyError::NotText)?;
        found = Some(super::name::canonical(s).map_err(BodyError::Name)?);
    }
    found.ok_or(BodyError::NoName)
}

/// A ClientHello carrying `sni` (tests, fuzzing and the benchmark).
pub fn sample(sni: &str) -> Vec<u8> {
    let name = sni.as_bytes();
    let mut sn = Vec::new();
    sn.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
    sn.push(0);
    sn.extend_from_slice(&(name.len() as u16).to_be_bytes());
    sn.extend_from_slice(name);
    let mut ext = vec![0, 0];
    ext.extend_from_slice(&(sn.len() as u16).to_be_bytes());
    ext.extend_from_slice(&sn);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1, 0];
    hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
    hs.extend_from_slice(&body);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_parses_in_pieces() {
        let h = sample("Files.Test.");
        for cut in 0..h.len() {
            assert_eq!(parse(&h[..cut]), Hello::More, "cut {cut}");
        }
        assert_eq!(parse(&h), Hello::Sni("files.test".into()));
    }

    #[test]
    fn refusals() {
        assert!(matches!(parse(b"GET / HTTP/1.1\r\n"), Hello::Refused(_)));
        assert!(matches!(
            parse(b"CONNECT a:443 HTTP/1.1\r\n"),
            Hello::Refused(_)
        ));
        assert!(matches!(parse(&sample("127.0.0.1")), Hello::Refused(_)));
        assert!(matches!(parse(&[22, 3, 1, 0xff, 0xff]), Hello::Refused(_)));
    }
}
