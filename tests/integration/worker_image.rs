//! The worker pulls kmod images from a real registry (Debian's `docker-registry` on
//! loopback): multi-layer images with whiteouts through a multi-platform index, unpacked
//! into a tree that `depmod` and `modprobe` read; pull secrets against a registry that
//! requires them; insecure pulls over TLS; and images it must refuse (a tampered blob, a
//! layer escaping the image root, an index without this platform).

use crate::registry;

use std::path::Path;
use std::process::Command;

use capstan_worker::image::{self, PullError, PullOptions, PulledImage};
use capstan_worker::pull_secret;
use registry::{
    DOCKER_LAYER_GZIP, KERNEL, LAYER_GZIP, Layer, PASSWORD, Registry, RegistryOptions, USER,
};
use tempfile::TempDir;

async fn pull(image: &str, dir: &Path, options: &PullOptions) -> Result<PulledImage, PullError> {
    image::pull(image, dir, options).await
}

/// What `modprobe -n -v` would run to load `module` from the module directory `base`.
fn dry_run(base: &Path, args: &[&str]) -> Vec<String> {
    let output = Command::new(registry::tool("modprobe"))
        .args(["-n", "-v", "-S", KERNEL, "-d"])
        .arg(base)
        .args(args)
        .output()
        .expect("modprobe (install kmod, as .ci/run does)");
    assert!(
        output.status.success(),
        "modprobe {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim_end().to_string())
        .collect()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn a_multi_layer_image_unpacks_into_a_tree_modprobe_loads_in_dependency_order() {
    let registry = Registry::start(RegistryOptions::default());
    let work = TempDir::new().unwrap();
    let modules = registry::compile_modules(&work.path().join("build"));
    let extra = format!("opt/lib/modules/{KERNEL}/extra");
    let lower = Layer::new()
        .tree(&modules, &format!("{extra}/"))
        .file(&format!("{extra}/stale.ko"), b"not a module")
        .file("firmware/fw-a.bin", b"firmware a")
        .file("firmware/old/fw-old.bin", b"old firmware")
        .gzip(DOCKER_LAYER_GZIP);
    let upper = Layer::new()
        .whiteout(&format!("{extra}/stale.ko"))
        .whiteout("firmware/old")
        .file("firmware/fw-b.bin", b"firmware b")
        .tar();
    let other_platform = Layer::new().file("wrong-platform", b"x").gzip(LAYER_GZIP);
    let arch = image::running_architecture();
    let other_arch = if arch == "s390x" { "arm64" } else { "s390x" };
    let digests = registry
        .push_index(
            "kmods/kmod-a",
            "v1",
            &[
                ("linux", other_arch, vec![other_platform]),
                ("linux", arch, vec![lower, upper]),
            ],
        )
        .await;

    let image = format!("{}/kmods/kmod-a:v1", registry.address());
    let options = PullOptions {
        insecure: true,
        ..PullOptions::default()
    };
    let image_dir = work.path().join("image");
    let pulled = pull(&image, &image_dir, &options).await.expect("pull");
    assert_eq!(pulled.digest, digests[1]);
    assert_eq!(pulled.layers, 2);
    assert!(!pulled.reused);
    assert_eq!(
        pulled.root,
        image_dir.join(digests[1].replace(':', "-")),
        "the image lands in a directory named after its digest"
    );
    // Only the finished image is left: no partial directory, no downloaded blobs.
    assert_eq!(entries(&image_dir), [digests[1].replace(':', "-")]);

    let root = &pulled.root;
    assert_eq!(entries(root), ["firmware", "opt"]);
    assert_eq!(
        entries(&root.join(&extra)),
        ["kmod-b.ko", "kmod_a.ko", "kmod_c.ko"]
    );
    assert_eq!(entries(&root.join("firmware")), ["fw-a.bin", "fw-b.bin"]);

    registry::depmod(&root.join("opt"));
    let modules_dir = root.join("opt/lib/modules").join(KERNEL);
    assert_eq!(
        dry_run(&root.join("opt"), &["kmod_a", "debug=1"]),
        [
            format!("insmod {}/extra/kmod-b.ko", modules_dir.display()),
            format!("insmod {}/extra/kmod_a.ko debug=1", modules_dir.display()),
        ]
    );

    // The same digest again: the unpacked image is reused.
    let again = pull(&image, &image_dir, &options)
        .await
        .expect("pull again");
    assert!(again.reused);
    assert_eq!(again.root, pulled.root);
}

#[tokio::test]
async fn a_pull_secret_opens_a_registry_that_requires_one() {
    let registry = Registry::start(RegistryOptions {
        basic_auth: true,
        ..RegistryOptions::default()
    });
    let layer = Layer::new().file("opt/hello", b"hello").gzip(LAYER_GZIP);
    registry.push_image("private/kmod", "v1", &[layer]).await;
    let image = format!("{}/private/kmod:v1", registry.address());
    let work = TempDir::new().unwrap();
    let secret = |user: &str, password: &str| {
        let text = serde_json::json!({"auths": {registry.address(): {"username": user, "password": password}}});
        pull_secret::parse(&text.to_string(), "secret.json").unwrap()
    };
    let options = |pull_secret| PullOptions {
        insecure_registries: vec![registry.address()],
        pull_secret,
        ..PullOptions::default()
    };

    let anonymous = pull(&image, work.path(), &options(Default::default()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        anonymous.contains(&format!(
            "(pulled anonymously: no pull secret entry matches {}/private/kmod)",
            registry.address()
        )),
        "{anonymous}"
    );
    let refused = pull(&image, work.path(), &options(secret(USER, "wrong")))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(&format!(
            "(the pull secret's credentials of user \"{USER}\" for {}/private/kmod were refused)",
            registry.address()
        )),
        "{refused}"
    );
    assert!(!refused.contains('\n'), "{refused}");

    let pulled = pull(&image, work.path(), &options(secret(USER, PASSWORD)))
        .await
        .expect("pull with the secret");
    assert_eq!(
        std::fs::read_to_string(pulled.root.join("opt/hello")).unwrap(),
        "hello"
    );
}

#[tokio::test]
async fn an_insecure_pull_accepts_a_self_signed_certificate_and_a_secure_one_does_not() {
    let registry = Registry::start(RegistryOptions {
        tls: true,
        ..RegistryOptions::default()
    });
    let layer = Layer::new().file("opt/hello", b"over TLS").gzip(LAYER_GZIP);
    registry.push_image("kmods/tls", "v1", &[layer]).await;
    let image = format!("{}/kmods/tls:v1", registry.address());
    let work = TempDir::new().unwrap();

    let err = pull(&image, work.path(), &PullOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("cannot pull {image}: over HTTPS: ")),
        "{err}"
    );
    assert!(err.contains("certificate"), "{err}");

    let insecure = PullOptions {
        insecure: true,
        ..PullOptions::default()
    };
    let pulled = pull(&image, work.path(), &insecure).await.expect("pull");
    assert_eq!(
        std::fs::read_to_string(pulled.root.join("opt/hello")).unwrap(),
        "over TLS"
    );
}

#[tokio::test]
async fn a_tampered_layer_is_refused_and_nothing_is_unpacked() {
    let registry = Registry::start(RegistryOptions::default());
    let good = Layer::new().file("opt/good.ko", b"good").gzip(LAYER_GZIP);
    let tampered = Layer::new()
        .file("opt/evil.ko", b"the content the manifest names")
        .tar();
    registry
        .push_image("kmods/tampered", "v1", &[good, tampered.clone()])
        .await;
    // Same length, other bytes: only the digest tells.
    let stored = registry.blob_file(&tampered.digest);
    let mut bytes = std::fs::read(&stored).unwrap();
    let at = bytes
        .windows(4)
        .position(|w| w == b"name")
        .expect("file content in the blob");
    bytes[at..at + 4].copy_from_slice(b"NAME");
    std::fs::write(&stored, &bytes).unwrap();

    let image = format!("{}/kmods/tampered:v1", registry.address());
    let work = TempDir::new().unwrap();
    let options = PullOptions {
        insecure: true,
        ..PullOptions::default()
    };
    let err = pull(&image, work.path(), &options).await.unwrap_err();
    let PullError::Digest {
        blob,
        expected,
        actual,
        ..
    } = &err
    else {
        panic!("not a digest error: {err}");
    };
    assert_eq!(blob, &format!("layer 2 ({})", tampered.digest));
    assert_eq!(expected, &tampered.digest);
    assert_eq!(actual, &registry::sha256(&bytes));
    assert_eq!(
        err.to_string(),
        format!(
            "cannot pull {image}: layer 2 ({}) has digest {actual}, the manifest says {}: the registry sent corrupted or tampered content",
            tampered.digest, tampered.digest
        )
    );
    assert!(
        entries(work.path()).is_empty(),
        "{:?}",
        entries(work.path())
    );
}

#[tokio::test]
async fn a_blob_longer_than_the_manifest_says_is_cut_short() {
    let registry = Registry::start(RegistryOptions::default());
    let layer = Layer::new().file("opt/a.ko", b"a").gzip(LAYER_GZIP);
    registry
        .push_image("kmods/long", "v1", std::slice::from_ref(&layer))
        .await;
    let stored = registry.blob_file(&layer.digest);
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes.extend(std::iter::repeat_n(0u8, 4 << 20));
    std::fs::write(&stored, &bytes).unwrap();

    let image = format!("{}/kmods/long:v1", registry.address());
    let work = TempDir::new().unwrap();
    let options = PullOptions {
        insecure: true,
        ..PullOptions::default()
    };
    let err = pull(&image, work.path(), &options).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot pull {image}: layer 1 ({}): the registry sent more than the manifest's {} bytes",
            layer.digest,
            layer.data.len()
        )
    );
    assert!(
        entries(work.path()).is_empty(),
        "{:?}",
        entries(work.path())
    );
}

#[tokio::test]
async fn a_layer_escaping_the_image_root_is_refused() {
    let registry = Registry::start(RegistryOptions::default());
    let work = TempDir::new().unwrap();
    let image_dir = work.path().join("a/b/image");
    let layer = Layer::new()
        .file("opt/ok.ko", b"ok")
        .raw_file("../../../escaped", b"escaped")
        .gzip(LAYER_GZIP);
    registry
        .push_image("kmods/traversal", "v1", std::slice::from_ref(&layer))
        .await;
    let image = format!("{}/kmods/traversal:v1", registry.address());
    let options = PullOptions {
        insecure_registries: vec![registry.address()],
        ..PullOptions::default()
    };
    let err = pull(&image, &image_dir, &options).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot unpack {image}: layer 1 ({}): entry \"../../../escaped\" refused: a `..` component would leave the image root",
            layer.digest
        )
    );
    assert!(!work.path().join("escaped").exists());
    assert!(!work.path().join("a/escaped").exists());
    assert!(entries(&image_dir).is_empty(), "{:?}", entries(&image_dir));
}

#[tokio::test]
async fn an_index_without_this_platform_says_which_platforms_it_has() {
    let registry = Registry::start(RegistryOptions::default());
    let layer = || Layer::new().file("opt/x", b"x").gzip(LAYER_GZIP);
    registry
        .push_index(
            "kmods/foreign",
            "v1",
            &[
                ("linux", "riscv64", vec![layer()]),
                ("windows", image::running_architecture(), vec![layer()]),
            ],
        )
        .await;
    let image = format!("{}/kmods/foreign:v1", registry.address());
    let work = TempDir::new().unwrap();
    let options = PullOptions {
        insecure: true,
        ..PullOptions::default()
    };
    let err = pull(&image, work.path(), &options).await.unwrap_err();
    let arch = image::running_architecture();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot pull {image}: the image index has no linux/{arch} image (it has: linux/riscv64, windows/{arch})"
        )
    );
}
