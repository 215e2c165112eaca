//! Which requests are package downloads, and where each registry says what
//! the download's digest is: npm's packument (`dist.integrity`), the crates
//! sparse index (`cksum`), PyPI's file paths (BLAKE2b-256).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::store::{Algorithm, Digest};
use crate::policy::{Host, Port, RegistryKind, RegistryRule};

/// A request for one package file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    /// The file's URL: what its cache entry is kept under.
    pub key: String,
    /// The request's path on the registry's host.
    pub path: String,
    /// For people: "npm left-pad 1.3.0 (left-pad-1.3.0.tgz)".
    pub label: String,
    pub source: Source,
}

/// Where the expected digest comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The URL names it (PyPI).
    Known(Digest),
    /// The packument at `path` on the registry's host lists a version whose
    /// tarball is at `tarball`.
    Npm { path: String, tarball: String },
    /// The index file at `path` on the index host lists `version`.
    Crates { path: String, version: String },
}

/// The download a GET of `path` (without its query) on `host:port` is,
/// when it is one.
pub fn recognize(rule: &RegistryRule, host: &Host, port: Port, path: &str) -> Option<Download> {
    let origin = match port {
        Port::HTTPS => format!("https://{host}"),
        port => format!("https://{host}:{port}"),
    };
    let key = format!("{origin}{path}");
    let rest = path.strip_prefix(rule.url.path.as_str()).filter(|_| rule.url.is_at(host, port));
    let download = match (rule.kind, rest) {
        (RegistryKind::Npm, Some(rest)) => npm(rule, path, rest, key),
        (RegistryKind::Crates, Some(rest)) => crates(rule, rest, key),
        (RegistryKind::Pypi, Some(rest)) => pypi(rest, key),
        // A sparse index's config.json may put downloads on the index host
        // (mirrors do): `.../<name>/<version>/download` there is a crate
        // too. Which host served it does not matter: the bytes are checked
        // against the index either way.
        (RegistryKind::Crates, None) if rule.index.as_ref().is_some_and(|i| i.is_at(host, port)) => {
            let tail: Vec<&str> = path.rsplitn(4, '/').collect();
            match tail.as_slice() {
                ["download", version, name, _] => crates(rule, &format!("{name}/{version}/download"), key),
                _ => None,
            }
        }
        _ => None,
    };
    download.map(|d| Download { path: path.to_string(), ..d })
}

fn npm(rule: &RegistryRule, path: &str, rest: &str, key: String) -> Option<Download> {
    let (name, file) = rest.split_once("/-/")?;
    let name = decode_npm(name);
    let segment_ok = |s: &str| !s.is_empty() && s != "." && s != ".." && s.bytes().all(npm_byte);
    let name_ok = match name.strip_prefix('@') {
        Some(scoped) => scoped.split_once('/').is_some_and(|(scope, n)| segment_ok(scope) && segment_ok(n)),
        None => segment_ok(&name),
    };
    if !name_ok || !file.ends_with(".tgz") || !segment_ok(file) {
        return None;
    }
    let version = file.strip_suffix(".tgz").and_then(|f| f.rsplit_once('-').map(|(_, v)| v)).unwrap_or("");
    Some(Download {
        path: String::new(),
        label: format!("npm {name} {version} ({file})"),
        source: Source::Npm {
            path: format!("{}{}", rule.url.path, name.replacen('/', "%2f", 1)),
            tarball: decode_npm(path),
        },
        key,
    })
}

fn npm_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The spellings npm clients use for a scoped name in a path.
fn decode_npm(text: &str) -> String {
    text.replace("%2f", "/").replace("%2F", "/").replace("%40", "@")
}

fn crates(rule: &RegistryRule, rest: &str, key: String) -> Option<Download> {
    let parts: Vec<&str> = rest.split('/').collect();
    let (name, version) = match parts.as_slice() {
        [name, version, "download"] => (*name, *version),
        [name, file] => (*name, file.strip_suffix(".crate")?.strip_prefix(name)?.strip_prefix('-')?),
        _ => return None,
    };
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    // Semver: starts with a digit, which also keeps `.` and `..` out.
    let version_ok = version.starts_with(|c: char| c.is_ascii_digit())
        && version.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+'));
    if !name_ok || !version_ok {
        return None;
    }
    let index = rule.index.as_ref()?;
    let lower = name.to_ascii_lowercase();
    let prefix = match lower.len() {
        1 => "1".to_string(),
        2 => "2".to_string(),
        3 => format!("3/{}", &lower[..1]),
        _ => format!("{}/{}", &lower[..2], &lower[2..4]),
    };
    Some(Download {
        path: String::new(),
        label: format!("crate {name} {version}"),
        source: Source::Crates { path: format!("{}{prefix}/{lower}", index.path), version: version.to_string() },
        key,
    })
}

fn pypi(rest: &str, key: String) -> Option<Download> {
    let parts: Vec<&str> = rest.split('/').collect();
    let [a, b, c, file] = parts.as_slice() else { return None };
    let file_ok = !file.is_empty()
        && *file != ".."
        && file.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'+' | b'!'));
    if a.len() != 2 || b.len() != 2 || !file_ok {
        return None;
    }
    let hex = format!("{a}{b}{c}").to_ascii_lowercase();
    let digest = Digest::from_hex(Algorithm::Blake2b256, &hex)?;
    Some(Download { path: String::new(), label: format!("PyPI {file}"), source: Source::Known(digest), key })
}

/// The digest the registry's metadata gives for the download.
pub fn digest_in(source: &Source, metadata: &[u8]) -> Result<Digest, String> {
    match source {
        Source::Known(digest) => Ok(digest.clone()),
        Source::Npm { tarball, .. } => npm_integrity(metadata, tarball),
        Source::Crates { version, .. } => crates_checksum(metadata, version),
    }
}

/// The parts of a packument read: everything else is skipped as it is
/// parsed, so a large one costs little memory beyond its own bytes.
#[derive(serde::Deserialize)]
struct Packument {
    versions: std::collections::HashMap<String, Version>,
}

#[derive(serde::Deserialize)]
struct Version {
    dist: Option<Dist>,
}

#[derive(serde::Deserialize)]
struct Dist {
    tarball: Option<String>,
    integrity: Option<String>,
}

fn npm_integrity(packument: &[u8], tarball: &str) -> Result<Digest, String> {
    let packument: Packument =
        serde_json::from_slice(packument).map_err(|e| format!("the packument is not one: {e}"))?;
    let dist = packument
        .versions
        .values()
        .filter_map(|v| v.dist.as_ref())
        .find(|dist| {
            let listed = dist.tarball.as_deref().unwrap_or("");
            let listed_path = listed.parse::<http::Uri>().ok().map(|u| decode_npm(u.path()));
            listed_path.as_deref() == Some(tarball)
        })
        .ok_or("no version in the packument has this tarball")?;
    let integrity = dist.integrity.as_deref().ok_or("the version lists no integrity")?;
    // Several may be listed; the strongest we know wins.
    let mut best: Option<Digest> = None;
    for item in integrity.split_whitespace() {
        let Some((algorithm, rest)) = item.split_once('-') else { continue };
        let algorithm = match algorithm {
            "sha512" => Algorithm::Sha512,
            "sha256" => Algorithm::Sha256,
            _ => continue,
        };
        let b64 = rest.split('?').next().unwrap_or("");
        let Some(digest) = BASE64.decode(b64).ok().and_then(|bytes| Digest::new(algorithm, bytes)) else { continue };
        if best.as_ref().is_none_or(|b| b.algorithm != Algorithm::Sha512) {
            best = Some(digest);
        }
    }
    best.ok_or_else(|| format!("no sha512 or sha256 in the integrity {integrity:?}"))
}

fn crates_checksum(index: &[u8], version: &str) -> Result<Digest, String> {
    let text = std::str::from_utf8(index).map_err(|_| "the index file is not text".to_string())?;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if entry.get("vers").and_then(|v| v.as_str()) == Some(version) {
            let cksum = entry.get("cksum").and_then(|c| c.as_str()).ok_or("the index lists no cksum")?;
            return Digest::from_hex(Algorithm::Sha256, cksum).ok_or_else(|| format!("bad cksum {cksum:?}"));
        }
    }
    Err(format!("the index has no version {version}"))
}

#[cfg(test)]
mod tests {
    use super::super::store::Hasher;
    use super::*;
    use crate::policy::RegistryUrl;

    fn rule(kind: RegistryKind, url: &str, index: Option<&str>) -> RegistryRule {
        let index = index.map(|i| RegistryUrl::parse(i).unwrap());
        RegistryRule::new(kind, RegistryUrl::parse(url).unwrap(), index, "t".into()).unwrap()
    }

    fn digest(algorithm: Algorithm, data: &[u8]) -> Digest {
        let mut h = Hasher::new(algorithm);
        h.update(data);
        h.finish()
    }

    #[test]
    fn npm_tarballs_plain_and_scoped() {
        let npm = rule(RegistryKind::Npm, "https://registry.npmjs.org/", None);
        let d = recognize(&npm, &npm.url.host, npm.url.port, "/left-pad/-/left-pad-1.3.0.tgz").unwrap();
        assert_eq!(d.key, "https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz");
        assert_eq!(
            d.source,
            Source::Npm { path: "/left-pad".into(), tarball: "/left-pad/-/left-pad-1.3.0.tgz".into() }
        );
        let d = recognize(&npm, &npm.url.host, npm.url.port, "/@types%2fnode/-/node-20.1.0.tgz").unwrap();
        assert_eq!(
            d.source,
            Source::Npm { path: "/@types%2fnode".into(), tarball: "/@types/node/-/node-20.1.0.tgz".into() }
        );
        for not in ["/left-pad", "/left-pad/-/x.tar", "/../-/a.tgz", "/a/-/b/c.tgz", "/@x/-/a.tgz"] {
            assert_eq!(recognize(&npm, &npm.url.host, npm.url.port, not), None, "{not}");
        }
    }

    #[test]
    fn npm_integrity_is_found_by_the_tarball_path() {
        let tarball = b"tarball bytes";
        let sha512 = BASE64.encode(<sha2::Sha512 as sha2::Digest>::digest(tarball));
        let packument = format!(
            r#"{{"versions":{{"1.0.0":{{"dist":{{"tarball":"https://r.test/a/-/a-1.0.0.tgz","integrity":"sha1-abc= sha512-{sha512}"}}}},
                "1.0.1":{{"dist":{{"tarball":"https://r.test/a/-/a-1.0.1.tgz","shasum":"00"}}}}}}}}"#
        );
        assert_eq!(npm_integrity(packument.as_bytes(), "/a/-/a-1.0.0.tgz"), Ok(digest(Algorithm::Sha512, tarball)));
        assert!(npm_integrity(packument.as_bytes(), "/a/-/a-1.0.1.tgz").unwrap_err().contains("no integrity"));
        assert!(npm_integrity(packument.as_bytes(), "/a/-/a-2.0.0.tgz").is_err());
    }

    #[test]
    fn crates_both_url_forms_and_their_index_paths() {
        let crates = rule(RegistryKind::Crates, "https://static.crates.io/crates/", Some("https://index.crates.io/"));
        let d = recognize(&crates, &crates.url.host, crates.url.port, "/crates/serde/1.0.200/download").unwrap();
        assert_eq!(d.source, Source::Crates { path: "/se/rd/serde".into(), version: "1.0.200".into() });
        let d = recognize(&crates, &crates.url.host, crates.url.port, "/crates/Syn/Syn-2.0.1.crate").unwrap();
        assert_eq!(d.source, Source::Crates { path: "/3/s/syn".into(), version: "2.0.1".into() });
        let d = recognize(&crates, &crates.url.host, crates.url.port, "/crates/cc/1.0.0/download").unwrap();
        assert_eq!(d.source, Source::Crates { path: "/2/cc".into(), version: "1.0.0".into() });
        assert_eq!(recognize(&crates, &crates.url.host, crates.url.port, "/crates/a/../download"), None);
        assert_eq!(recognize(&crates, &crates.url.host, crates.url.port, "/crates/a/b-1.crate"), None);
        // Downloads a mirror's config.json puts on the index host.
        let index = Host::parse("index.crates.io").unwrap();
        let d =
            recognize(&crates, &index, Port::HTTPS, "/artifactory/api/cargo/v1/crates/itoa/1.0.11/download").unwrap();
        assert_eq!(d.key, "https://index.crates.io/artifactory/api/cargo/v1/crates/itoa/1.0.11/download");
        assert_eq!(d.source, Source::Crates { path: "/it/oa/itoa".into(), version: "1.0.11".into() });
        assert_eq!(recognize(&crates, &index, Port::HTTPS, "/it/oa/itoa"), None);
        assert_eq!(recognize(&crates, &index, Port::HTTPS, "/config.json"), None);

        let data = b"crate bytes";
        let index = format!(
            "{{\"name\":\"a\",\"vers\":\"0.9.0\",\"cksum\":\"{}\"}}\n{{\"name\":\"a\",\"vers\":\"1.0.0\",\"cksum\":\"{}\"}}\n",
            "00".repeat(32),
            digest(Algorithm::Sha256, data).hex()
        );
        assert_eq!(crates_checksum(index.as_bytes(), "1.0.0"), Ok(digest(Algorithm::Sha256, data)));
        assert!(crates_checksum(index.as_bytes(), "2.0.0").is_err());
    }

    #[test]
    fn pypi_paths_carry_the_blake2b_digest() {
        let pypi = rule(RegistryKind::Pypi, "https://files.pythonhosted.org/packages/", None);
        let d = digest(Algorithm::Blake2b256, b"wheel");
        let hex = d.hex();
        let path = format!("/packages/{}/{}/{}/six-1.16.0-py2.py3-none-any.whl", &hex[..2], &hex[2..4], &hex[4..]);
        assert_eq!(recognize(&pypi, &pypi.url.host, pypi.url.port, &path).unwrap().source, Source::Known(d));
        assert_eq!(recognize(&pypi, &pypi.url.host, pypi.url.port, "/packages/ab/cd/ef/six.whl"), None);
        assert_eq!(recognize(&pypi, &pypi.url.host, pypi.url.port, "/simple/six/"), None);
    }
}
