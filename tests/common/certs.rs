//! A test CA and a certificate it signed for `localhost` and 127.0.0.1, made
//! with the `openssl` CLI.

use std::path::{Path, PathBuf};

/// A CA and a certificate it signed for `localhost` and 127.0.0.1, and an
/// unrelated CA.
pub(crate) struct Certs {
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("the openssl CLI is needed for this test: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn make_certs() -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=tollgate test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(d, &ca);
    let other: Vec<&str> = (ca.iter())
        .map(|a| match *a {
            "ca.key" => "other.key",
            "ca.pem" => "other.pem",
            "/CN=tollgate test CA" => "/CN=unrelated test CA",
            a => a,
        })
        .collect();
    openssl(d, &other);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(d, &csr);
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    Certs {
        ca: d.join("ca.pem"),
        other_ca: d.join("other.pem"),
        cert: d.join("server.pem"),
        key: d.join("server.key"),
        _dir: dir,
    }
}
