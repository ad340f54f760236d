//! `cargo xtask images`: builds the three images of the root `Dockerfile` (one target each) and
//! tags them; optionally pushes them and pins the release manifests to their digests.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// One image: its Dockerfile target, local name (what `deploy/overlays/kind` and `flux/kind`
/// use) and published name (what `deploy/overlays/release` and `flux/release` use).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Image {
    pub(crate) target: &'static str,
    pub(crate) local: &'static str,
    pub(crate) published: &'static str,
}

/// The images, in build order.
pub(crate) const IMAGES: [Image; 3] = [
    Image {
        target: "controller",
        local: "agent-sandbox/controller",
        published: "agent-sandbox-controller",
    },
    Image {
        target: "router",
        local: "agent-sandbox/router",
        published: "sandbox-router",
    },
    Image {
        target: "runtime",
        local: "agent-sandbox/runtime-python",
        published: "sandbox-runtime-python",
    },
];

/// The local tag the kind overlay expects.
pub(crate) const DEV_TAG: &str = "dev";

/// What to build.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// Tag of every image.
    pub(crate) tag: String,
    /// Registry prefix (`ghcr.io/agent-sandbox-rs`); the local names when `None`.
    pub(crate) registry: Option<String>,
    /// Push after building (needs `registry`).
    pub(crate) push: bool,
    /// Write the pushed digests into the release overlay and Flux release objects.
    pub(crate) pin_release: bool,
}

impl Options {
    /// Local `agent-sandbox/*:dev` images, neither pushed nor pinned (kind and k3s load them).
    pub(crate) fn dev() -> Self {
        Self {
            tag: DEV_TAG.to_owned(),
            registry: None,
            push: false,
            pin_release: false,
        }
    }
}

/// `<registry>/<published>:<tag>`, or `<local>:<tag>` without a registry.
pub(crate) fn reference(image: &Image, options: &Options) -> String {
    match &options.registry {
        Some(registry) => format!(
            "{}/{}:{}",
            registry.trim_end_matches('/'),
            image.published,
            options.tag
        ),
        None => format!("{}:{}", image.local, options.tag),
    }
}

/// Fails with instructions unless the `docker` CLI is installed and its daemon answers.
pub(crate) fn require_docker() -> Result<()> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
    {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!(
            "docker is not installed: building images needs Docker (or a Docker-compatible CLI with BuildKit).\n\
             Install it from https://docs.docker.com/engine/install/ and run `cargo xtask images` again.\n\
             Nothing else in this repository needs Docker: `cargo test --workspace` runs on the simulated cluster."
        ),
        Err(error) => Err(error).context("failed to run `docker info`"),
        Ok(output) if !output.status.success() => bail!(
            "the Docker daemon is not reachable (`docker info` failed: {}).\n\
             Start Docker (e.g. `sudo systemctl start docker`, or Docker Desktop) and run the command again.",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Ok(_) => Ok(()),
    }
}

/// Runs a command, echoing it; fails naming it.
pub(crate) fn run(command: &mut Command) -> Result<()> {
    eprintln!("+ {}", show(command));
    let status = command
        .status()
        .with_context(|| format!("failed to start `{}`", show(command)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", show(command));
    }
    Ok(())
}

/// A command as a shell-like line, for messages.
pub(crate) fn show(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Builds (and optionally pushes and pins) every image; returns the references built.
pub(crate) fn build(root: &Path, options: &Options) -> Result<Vec<String>> {
    if options.push && options.registry.is_none() {
        bail!("--push needs --registry (where to push)");
    }
    if options.pin_release && !options.push {
        bail!("--pin-release needs --push (digests exist once pushed)");
    }
    require_docker()?;
    let mut built = Vec::new();
    for image in &IMAGES {
        let reference = reference(image, options);
        run(Command::new("docker")
            .current_dir(root)
            .env("DOCKER_BUILDKIT", "1")
            .args(["build", "--file", "Dockerfile", "--target", image.target])
            .args(["--tag", &reference, "."]))?;
        built.push(reference);
    }
    if options.push {
        for (image, reference) in IMAGES.iter().zip(&built) {
            run(Command::new("docker").args(["push", reference]))?;
            if options.pin_release {
                let digest = pushed_digest(reference)?;
                let registry = options.registry.as_deref().unwrap_or_default();
                let name = format!("{}/{}", registry.trim_end_matches('/'), image.published);
                pin_everywhere(root, &name, &digest)?;
            }
        }
    }
    Ok(built)
}

/// The `sha256:...` digest the registry gave a pushed reference.
fn pushed_digest(reference: &str) -> Result<String> {
    let output = Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{range .RepoDigests}}{{println .}}{{end}}",
            reference,
        ])
        .output()
        .context("failed to run `docker image inspect`")?;
    let repository = reference.rsplit_once(':').map_or(reference, |(r, _)| r);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{repository}@")))
        .map(str::to_owned)
        .with_context(|| format!("no registry digest for {reference} after pushing it"))
}

/// Files whose `images:` entries carry release digests.
pub(crate) const RELEASE_FILES: [&str; 3] = [
    "deploy/overlays/release/kustomization.yaml",
    "flux/release/controller.yaml",
    "flux/release/sandboxes.yaml",
];

fn pin_everywhere(root: &Path, name: &str, digest: &str) -> Result<()> {
    for file in RELEASE_FILES {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("failed to read {}", path.display()))?;
        let pinned = pin(&text, name, digest);
        if pinned != text {
            std::fs::write(&path, pinned)
                .with_context(|| format!("failed to write {}", path.display()))?;
            eprintln!("pinned {name}@{digest} in {file}");
        }
    }
    Ok(())
}

/// Replaces the `digest:` that follows `newName: <name>` in an `images:` list.
pub(crate) fn pin(text: &str, name: &str, digest: &str) -> String {
    let mut out = Vec::new();
    let mut armed = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.strip_prefix("newName:").map(str::trim) == Some(name) {
            armed = true;
        } else if armed && trimmed.starts_with("digest:") {
            let indent = &line[..line.len() - trimmed.len()];
            out.push(format!("{indent}digest: {digest}"));
            armed = false;
            continue;
        } else if trimmed.starts_with("- ") {
            armed = false;
        }
        out.push(line.to_owned());
    }
    let mut joined = out.join("\n");
    if text.ends_with('\n') {
        joined.push('\n');
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_replaces_only_the_named_image() {
        let text = "images:\n  - name: a\n    newName: r.io/x/a\n    digest: sha256:00\n  - name: b\n    newName: r.io/x/b\n    digest: sha256:00\n";
        let pinned = pin(text, "r.io/x/b", "sha256:ff");
        assert_eq!(
            pinned,
            "images:\n  - name: a\n    newName: r.io/x/a\n    digest: sha256:00\n  - name: b\n    newName: r.io/x/b\n    digest: sha256:ff\n"
        );
    }

    #[test]
    fn release_files_name_every_published_image() {
        let root = crate::workspace_root();
        let all: String = RELEASE_FILES
            .iter()
            .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
            .collect();
        for image in &IMAGES {
            let name = format!("ghcr.io/agent-sandbox-rs/{}", image.published);
            assert!(all.contains(&format!("newName: {name}")), "{name}");
        }
    }

    #[test]
    fn references() {
        let local = Options {
            tag: DEV_TAG.into(),
            registry: None,
            push: false,
            pin_release: false,
        };
        assert_eq!(
            reference(&IMAGES[0], &local),
            "agent-sandbox/controller:dev"
        );
        let published = Options {
            registry: Some("ghcr.io/agent-sandbox-rs/".into()),
            tag: "v1".into(),
            ..local
        };
        assert_eq!(
            reference(&IMAGES[2], &published),
            "ghcr.io/agent-sandbox-rs/sandbox-runtime-python:v1"
        );
    }
}
