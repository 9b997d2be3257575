//! A JSON merge patch whose body is `null` is no patch at all: kube-apiserver's merge
//! refuses it (and any other scalar body) with 400 `Invalid JSON Patch` before it reads
//! the object, where RFC 7386 alone would replace the whole object with nothing.

use crate::common;
use crate::requests::{MAPS, MERGE, MODULES, PODS, get, seed, send};

/// Through the main resource and the status subresource, of built-in and custom kinds
/// alike, the answer is upstream's and the object is as it was.
#[tokio::test]
async fn a_null_merge_patch_is_refused_and_changes_nothing() {
    let (cluster, _client) = common::start().await;
    seed(&cluster).await;
    let targets = [
        (format!("{MAPS}/c"), ""),
        (format!("{PODS}/p"), ""),
        (format!("{PODS}/p"), "/status"),
        (format!("{MODULES}/m"), ""),
        (format!("{MODULES}/m"), "/status"),
    ];
    for (object, sub) in targets {
        let before = get(&cluster, &object).await;
        let path = format!("{object}{sub}");
        for body in [&b"null"[..], b"3", b"\"x\"", b"true"] {
            let what = format!("{} to {path}", String::from_utf8_lossy(body));
            let (code, status) = send(&cluster, "PATCH", &path, MERGE, body).await;
            assert_eq!(code, 400, "{what}: {status}");
            assert_eq!(status["kind"], "Status", "{what}");
            assert_eq!(status["reason"], "BadRequest", "{what}: {status}");
            assert_eq!(status["message"], "Invalid JSON Patch", "{what}: {status}");
        }
        assert_eq!(
            get(&cluster, &object).await,
            before,
            "{path} changed nothing"
        );
    }
}
