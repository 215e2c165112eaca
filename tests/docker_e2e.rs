//! Docker in image mode (`--docker`): dockerd in the guest pulls through the
//! egress proxy when the policy allows the registry and is refused when it
//! does not; without an image that has Docker the run stops with the fix.
//!
//! Docker Hub is out of reach here, so the registry is a local one
//! (tests/docker_registry.py) serving a tiny image. Its host has a
//! credential rule, so the proxy intercepts its TLS: dockerd must then trust
//! the proxy's CA, and the registry answers only with the injected token.

use std::process::Command;
use std::time::Duration;

use crate::image_e2e::{builder_available, image, text};
use crate::network_e2e::{credential_policy, test_certificate};
use crate::rig;
use crate::run_e2e::script;
use crate::util::stockade_bin;

/// Two VM runs with dockerd under the software CPU, one of them a pull.
const T_DOCKER: Duration = Duration::from_secs(600);

/// Shell lines: a test CA, a certificate for registry.test signed by it,
/// the registry started in the background (`$registry` is its pid), and
/// p.toml, a policy that allows it and injects its token.
/// The registry's script travels inside the shell script: L1 has a /tmp of
/// its own, so a checkout there would not be visible at its path.
fn registry_and_policy() -> String {
    let registry = include_str!("docker_registry.py");
    test_certificate("registry.test")
        + &format!(
            "cat > \"$ws.registry.py\" <<'REGISTRY_PY'\n{registry}\nREGISTRY_PY\n\
             python3 \"$ws.registry.py\" \"$ws/requests.log\" & registry=$!\n"
        )
        + &credential_policy("registry.test", "127.0.0.1", "REGISTRY_TOKEN")
        + "sleep 1\n"
}

#[test]
fn docker_pulls_through_the_proxy_only_when_the_policy_allows_the_registry() {
    let test = "docker_pulls_through_the_proxy_only_when_the_policy_allows_the_registry";
    let Some(rig) = rig::require(test) else { return };
    if !builder_available(test) {
        return;
    }
    let built = image(&["build", "docker"]);
    assert!(built.status.success(), "{}", text(&built));
    let body = registry_and_policy()
        + r#"SSL_CERT_FILE="$ws/ca.pem" REGISTRY_TOKEN=test-registry-token \
    $S run --image docker --docker --policy ./p.toml -- sh -c 'stat -c "socket-group=%g" /run/docker.sock; id -g
        docker run --rm registry.test:8443/hello'
echo "allowed=$?"
$S run --image docker --docker -- docker pull registry.test:8443/hello; echo "refused=$?"
kill $registry
echo "--- requests"; cat requests.log"#;
    let out = rig.sh(&script(&body), T_DOCKER);
    assert!(out.stdout.contains("Hello from a stockade test image"), "the container must run\n{out}");
    assert!(out.stdout.contains("allowed=0"), "{out}");
    let guest = out.stdout.split("--- requests").next().unwrap_or_default();
    let gid = guest.lines().find_map(|l| l.strip_prefix("socket-group=")).unwrap_or("none");
    assert!(guest.lines().any(|l| l == gid), "the socket must belong to the command's group\n{out}");
    let requests = out.stdout.split("--- requests").nth(1).unwrap_or_default();
    assert!(requests.contains("/v2/hello/manifests/latest auth=Bearer test-registry-token"), "{out}");
    assert!(!out.stdout.contains("refused=0"), "the pull must fail without the registry in the policy\n{out}");
    assert!(
        out.stderr.contains("Forbidden")
            && out.stderr.contains("the policy refused registry.test:8443")
            && out.stderr.contains("--policy docker"),
        "the refusal must name the host and the fix\n{out}"
    );
    assert_eq!(requests.matches("GET /v2/ ").count(), 1, "the refused pull must not reach the registry\n{out}");
}

#[test]
fn docker_without_an_image_that_has_it_names_the_fix() {
    let out = Command::new(stockade_bin())
        .args(["run", "--docker", "--", "docker", "ps"])
        .env_remove("RUST_LOG")
        .output()
        .expect("run stockade");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--docker needs --image") && stderr.contains("stockade image build docker"),
        "{}",
        text(&out)
    );

    let test = "docker_without_an_image_that_has_it_names_the_fix";
    let Some(rig) = rig::require(test) else { return };
    if !builder_available(test) {
        return;
    }
    let built = image(&["build", "debian"]);
    assert!(built.status.success(), "{}", text(&built));
    let out = rig.sh(&script("$S run --image debian --docker -- true; echo \"status=$?\""), crate::run_e2e::T);
    assert!(out.stdout.contains("status=125"), "{out}");
    assert!(
        out.stderr.contains("this image has no /usr/sbin/dockerd") && out.stderr.contains("image build docker"),
        "{out}"
    );
}
