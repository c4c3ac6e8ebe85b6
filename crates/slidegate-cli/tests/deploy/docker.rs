//! deploy/Dockerfile, checked without a Docker daemon.
//!
//! The build: a release build of the whole workspace takes minutes (fat
//! LTO), too slow for every test run, so its step is checked rather than
//! run: the build stage's `RUN` is exactly `cargo build --release --locked
//! -p slidegate-cli`; `cargo metadata --locked --offline` agrees that
//! Cargo.lock needs no change (what `--locked` demands) and says which
//! binary that package builds; the binary the stage copies out is that one,
//! the one this test has built (`CARGO_BIN_EXE_slidegate`); and every
//! workspace member is in what the stage copies in (and in the build
//! context `.dockerignore` lets through).
//!
//! The image: its files are worked out from the build stage's `mkdir`,
//! `cp` and `ln -s` and the runtime stage's `COPY --from`, laid out in a
//! folder (the built binary in place of the release one), and run as the
//! image runs them: its `ENTRYPOINT` and `CMD`, its `ENV` and nothing else
//! of this machine's environment, as its `USER` (through `setpriv`, the
//! test running as root), with every file of the image root's and so
//! read-only for that user. The listeners the command names are moved to
//! free loopback ports (a test listens on loopback only); their ports must
//! be the ones `EXPOSE` names. Then `/bin/ratelimit` is started as Envoy
//! Gateway starts it, with envoyproxy/ratelimit's variables only.

use crate::{common, read, root, shown, tool};
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One instruction: its keyword in upper case, its arguments as written
/// (continuation lines joined), and the line it starts on.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
    line: usize,
}

/// The Dockerfile's instructions: comment lines (parser directives among
/// them) and blank lines dropped, lines ending in `\` joined to the next,
/// comment lines inside a continued instruction skipped as Docker skips
/// them.
fn instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_none()) {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((number + 1, String::new()));
        let (body, continued) = match trimmed.strip_suffix('\\') {
            Some(body) => (body.trim_end(), true),
            None => (trimmed, false),
        };
        if !joined.is_empty() && !body.is_empty() {
            joined.push(' ');
        }
        joined.push_str(body);
        if continued {
            pending = Some((start, joined));
        } else if !joined.is_empty() {
            let (keyword, args) = joined.split_once(char::is_whitespace).unwrap_or((&joined, ""));
            out.push(Instruction {
                keyword: keyword.to_ascii_uppercase(),
                args: args.trim().to_owned(),
                line: start,
            });
        }
    }
    assert!(pending.is_none(), "the Dockerfile ends inside a continued line");
    out
}

/// An exec-form argument list (`["a", "b"]`), as Docker reads it: JSON.
fn exec_form(instruction: &Instruction) -> Vec<String> {
    assert!(
        instruction.args.starts_with('['),
        "line {}: {} should be in exec form (a JSON array): the image has no shell",
        instruction.line,
        instruction.keyword
    );
    serde_json::from_str(&instruction.args)
        .unwrap_or_else(|e| panic!("line {}: {}: {e}", instruction.line, instruction.keyword))
}

/// Shell-form words: only plain words are modelled (no quotes, no
/// variables), which is all the Dockerfile needs.
fn words(text: &str, line: usize) -> Vec<String> {
    assert!(
        !text.contains(['"', '\'', '$', '`', ';', '|']),
        "line {line}: {text:?}: quoting, variables and pipes are not modelled"
    );
    text.split_whitespace().map(str::to_owned).collect()
}

/// One build stage: its base image, its name and its instructions.
#[derive(Debug)]
struct Stage {
    image: String,
    name: Option<String>,
    body: Vec<Instruction>,
}

fn stages(instructions: Vec<Instruction>) -> Vec<Stage> {
    let mut out: Vec<Stage> = Vec::new();
    for instruction in instructions {
        if instruction.keyword == "FROM" {
            let parts: Vec<&str> = instruction.args.split_whitespace().collect();
            let (image, name) = match parts[..] {
                [image] => (image, None),
                [image, as_, name] if as_.eq_ignore_ascii_case("as") => (image, Some(name.to_owned())),
                _ => panic!("line {}: FROM {:?} not modelled", instruction.line, instruction.args),
            };
            out.push(Stage {
                image: image.to_owned(),
                name,
                body: Vec::new(),
            });
        } else {
            out.last_mut()
                .unwrap_or_else(|| panic!("line {}: an instruction before FROM", instruction.line))
                .body
                .push(instruction);
        }
    }
    out
}

impl Stage {
    fn all(&self, keyword: &str) -> Vec<&Instruction> {
        self.body.iter().filter(|i| i.keyword == keyword).collect()
    }

    /// The stage's one `keyword` instruction.
    fn one(&self, keyword: &str) -> &Instruction {
        match self.all(keyword)[..] {
            [one] => one,
            ref many => panic!("stage {:?}: {} {keyword} instructions, not one", self.name, many.len()),
        }
    }
}

/// A file of an image, as far as the test follows it.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Dir,
    /// A regular file: the path it was copied from in the build stage's
    /// working folder (`target/release/slidegate`).
    Built(String),
    /// A symbolic link, to this target.
    Link(String),
}

/// The files of one stage, by absolute path.
type Tree = BTreeMap<String, Entry>;

/// `path` made absolute against `dir` and normalised (no `.`, no `//`, no
/// trailing `/`).
fn absolute(dir: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{dir}/{path}")
    };
    let parts: Vec<&str> = joined.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    assert!(!parts.contains(&".."), "{path}: `..` not modelled");
    format!("/{}", parts.join("/"))
}

fn parent(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((dir, _)) => dir,
    }
}

/// The build stage's `RUN`, run on a model: `cargo build` (checked
/// elsewhere), `mkdir -p`, `cp` and `ln -s`, joined by `&&`; what it
/// leaves, outside the working folder. Its `--mount` options come back
/// separately.
fn run_build_step(run: &Instruction, workdir: &str) -> (Vec<String>, Vec<Vec<String>>, Tree) {
    let mut all = words(&run.args, run.line);
    let mounts: Vec<String> = all.iter().take_while(|w| w.starts_with("--")).cloned().collect();
    all.drain(..mounts.len());
    let commands: Vec<Vec<String>> = all
        .split(|w| w == "&&")
        .map(<[String]>::to_vec)
        .filter(|c| !c.is_empty())
        .collect();
    let mut tree = Tree::new();
    for command in &commands {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        match args[..] {
            ["cargo", ..] => {}
            ["mkdir", "-p", ref dirs @ ..] => {
                for dir in dirs {
                    let mut path = absolute(workdir, dir);
                    while path != "/" {
                        tree.insert(path.clone(), Entry::Dir);
                        path = parent(&path).to_owned();
                    }
                }
            }
            ["cp", from, to] => {
                let to = absolute(workdir, to);
                assert_eq!(
                    tree.get(parent(&to)),
                    Some(&Entry::Dir),
                    "cp {from} {to}: no folder there"
                );
                assert!(!from.starts_with('/'), "cp {from}: from the working folder only");
                tree.insert(to, Entry::Built(from.to_owned()));
            }
            ["ln", "-s", target, link] => {
                let link = absolute(workdir, link);
                assert_eq!(
                    tree.get(parent(&link)),
                    Some(&Entry::Dir),
                    "ln -s {target} {link}: no folder there"
                );
                tree.insert(link, Entry::Link(target.to_owned()));
            }
            _ => panic!("line {}: {command:?} is not modelled", run.line),
        }
    }
    (mounts, commands, tree)
}

/// `path` in `tree` with the links on the way followed (absolute targets
/// only); `None` when it leads nowhere.
fn resolve(tree: &Tree, path: &str) -> Option<(String, Entry)> {
    let mut path = path.to_owned();
    for _ in 0..16 {
        match tree.get(&path)? {
            Entry::Link(target) => path = absolute(parent(&path), target),
            entry => return Some((path, entry.clone())),
        }
    }
    None
}

/// The runtime stage's `COPY --from=STAGE SRC DEST`, applied: a source
/// named as a folder (`/rootfs/bin/`) copies what is in it, links kept;
/// a source that is a link is followed, as BuildKit's COPY follows it.
fn copy_from(copy: &Instruction, stages: &BTreeMap<String, Tree>, image: &mut Tree) {
    let parts = words(&copy.args, copy.line);
    let [from, source, dest] = &parts[..] else {
        panic!("line {}: COPY {:?} not modelled", copy.line, copy.args)
    };
    let stage = from.strip_prefix("--from=").unwrap_or_else(|| {
        panic!(
            "line {}: only COPY --from=STAGE is expected in the runtime stage",
            copy.line
        )
    });
    let tree = &stages[stage];
    let source_path = absolute("/", source);
    let dest_path = absolute("/", dest);
    let (resolved, entry) =
        resolve(tree, &source_path).unwrap_or_else(|| panic!("line {}: {source} is not made by {stage}", copy.line));
    let mut put = |path: String, entry: Entry| {
        let mut dir = parent(&path).to_owned();
        while dir != "/" {
            image.entry(dir.clone()).or_insert(Entry::Dir);
            dir = parent(&dir).to_owned();
        }
        image.insert(path, entry);
    };
    if entry == Entry::Dir {
        put(dest_path.clone(), Entry::Dir);
        let inside = format!("{resolved}/");
        for (path, entry) in tree.range(inside.clone()..) {
            let Some(rest) = path.strip_prefix(&inside) else { break };
            put(format!("{}/{rest}", dest_path.trim_end_matches('/')), entry.clone());
        }
    } else {
        let into_folder = dest.ends_with('/');
        let target = if into_folder {
            format!("{dest_path}/{}", source_path.rsplit('/').next().unwrap())
        } else {
            dest_path
        };
        put(target, entry);
    }
}

/// What the Dockerfile says, worked out.
struct Image {
    build: Stage,
    /// The build stage's step: its mounts and its `&&`-joined commands.
    build_commands: Vec<Vec<String>>,
    build_workdir: String,
    /// The runtime image's files.
    files: Tree,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<(String, String)>,
    user: (u32, u32),
    expose: Vec<u16>,
}

fn image() -> Image {
    let mut stages = stages(instructions(&read("Dockerfile")));
    assert_eq!(stages.len(), 2, "a build stage and a runtime stage");
    let runtime = stages.pop().unwrap();
    let build = stages.pop().unwrap();
    let build_name = build.name.clone().expect("the build stage is named");
    assert!(
        build.image.starts_with("rust:1"),
        "the build stage starts from the official Rust image: {}",
        build.image
    );
    let workdir = absolute("/", &build.one("WORKDIR").args);
    let (mounts, build_commands, tree) = run_build_step(build.one("RUN"), &workdir);
    for mount in &mounts {
        assert!(mount.starts_with("--mount=type=cache,"), "{mount}: only cache mounts");
    }
    let mut files = Tree::new();
    let built = BTreeMap::from([(build_name.clone(), tree)]);
    for copy in runtime.all("COPY") {
        copy_from(copy, &built, &mut files);
    }
    let env = runtime
        .all("ENV")
        .into_iter()
        .flat_map(|i| words(&i.args, i.line))
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .unwrap_or_else(|| panic!("ENV {pair}: only NAME=VALUE is modelled"));
            (name.to_owned(), value.to_owned())
        })
        .collect();
    let (uid, gid) = runtime
        .one("USER")
        .args
        .split_once(':')
        .expect("USER UID:GID, by number");
    let expose = runtime
        .all("EXPOSE")
        .into_iter()
        .flat_map(|i| words(&i.args, i.line))
        .map(|p| p.trim_end_matches("/tcp").parse().expect("EXPOSE PORT"))
        .collect();
    Image {
        entrypoint: exec_form(runtime.one("ENTRYPOINT")),
        cmd: exec_form(runtime.one("CMD")),
        env,
        user: (uid.parse().expect("a numeric uid"), gid.parse().expect("a numeric gid")),
        expose,
        build_commands,
        build_workdir: workdir,
        files,
        build,
    }
}

/// `cargo metadata` of the workspace, `--locked --offline`: it fails if
/// Cargo.lock would change, as `cargo build --locked` would (the whole
/// workspace is resolved; only this platform's packages are read, those
/// the tests' build has downloaded).
fn metadata() -> Value {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let platform = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &platform])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata --locked: {}", shown(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What the build stage copies from the build context: paths relative to
/// the repository's root.
fn copied_into_build(image: &Image) -> Vec<String> {
    image
        .build
        .all("COPY")
        .into_iter()
        .flat_map(|copy| {
            let mut parts = words(&copy.args, copy.line);
            assert!(!parts[0].starts_with("--"), "the build stage copies from the context");
            parts.pop();
            parts
        })
        .map(|p| p.trim_end_matches('/').to_owned())
        .collect()
}

/// `from` copied to `to`, folders whole but for `target/` folders (which
/// .dockerignore keeps out).
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name() != "target" {
                copy_tree(&entry.path(), &to.join(entry.file_name()));
            }
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
}

/// The build stage's command compiles from what it copies alone: the
/// context's files laid out as the stage lays them out, and its cargo
/// command run there with `check` for `build` (every build script runs and
/// every `include_str!` is read, without the release build's code
/// generation) and `--offline` (the crates come from this machine's cache,
/// the versions from Cargo.lock).
#[test]
fn the_build_context_holds_all_the_build_reads() {
    let image = image();
    let dir = common::fresh("deploy-build-context");
    let src = dir.join("src");
    for path in copied_into_build(&image) {
        copy_tree(&root().join(&path), &src.join(&path));
    }
    let cargo: Vec<String> = image
        .build_commands
        .iter()
        .find(|c| c[0] == "cargo")
        .expect("the build stage runs cargo")
        .iter()
        .skip(1)
        .map(|word| {
            if word == "build" {
                "check".to_owned()
            } else {
                word.clone()
            }
        })
        .chain(["--offline".to_owned()])
        .collect();
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(&cargo)
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo {}: {}", cargo.join(" "), shown(&out));
    std::fs::remove_dir_all(dir).unwrap();
}

/// The build stage builds, with the lock file as it is, the package whose
/// binary this test suite runs, from a workspace it copies whole.
#[test]
fn the_build_stage_builds_the_tested_binary_from_the_locked_workspace() {
    let image = image();
    let cargo: Vec<&Vec<String>> = image.build_commands.iter().filter(|c| c[0] == "cargo").collect();
    assert_eq!(
        cargo,
        [&["cargo", "build", "--release", "--locked", "-p", "slidegate-cli"]
            .map(String::from)
            .to_vec()],
        "the build stage's cargo command"
    );

    let metadata = metadata();
    let package = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "slidegate-cli")
        .expect("slidegate-cli is in the workspace");
    let bins: Vec<&str> = package["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(bins, ["slidegate"], "the binaries of slidegate-cli");
    let tested = Path::new(env!("CARGO_BIN_EXE_slidegate")).file_name().unwrap();
    assert_eq!(tested, bins[0], "the binary the tests run is the package's");
    // The one file the step copies out of target/ is that binary, built
    // by --release.
    let built: Vec<&Entry> = image.files.values().filter(|e| matches!(e, Entry::Built(_))).collect();
    assert_eq!(built, [&Entry::Built(format!("target/release/{}", bins[0]))]);

    // Every member of the workspace, and the workspace's own manifest and
    // lock file, is copied into the build stage and let into the build
    // context.
    let copied = copied_into_build(&image);
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    let ignore: Vec<&str> = ignore
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert_eq!(ignore.first(), Some(&"*"), ".dockerignore lets in only what it names");
    let let_in: Vec<&str> = ignore
        .iter()
        .filter_map(|l| l.strip_prefix('!'))
        .map(|p| p.trim_end_matches('/'))
        .collect();
    let root_dir = std::fs::canonicalize(root()).unwrap();
    let mut needed = vec!["Cargo.toml".to_owned(), "Cargo.lock".to_owned()];
    for member in metadata["workspace_members"].as_array().unwrap() {
        let package = metadata["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == *member)
            .unwrap();
        let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap());
        let dir = manifest.parent().unwrap().strip_prefix(&root_dir).unwrap();
        needed.push(dir.to_str().unwrap().to_owned());
    }
    for path in &needed {
        let under = |list: &[&str]| list.iter().any(|p| path == p || path.starts_with(&format!("{p}/")));
        let copied: Vec<&str> = copied.iter().map(String::as_str).collect();
        assert!(under(&copied), "{path} is not copied into the build stage: {copied:?}");
        assert!(
            under(&let_in),
            "{path} is kept out of the build context by .dockerignore"
        );
    }
    assert_eq!(image.build_workdir, "/src");
}

/// The image's files, laid out under `dir`: folders, the tested binary in
/// place of the release one (mode 0755, as cargo leaves it), and the links,
/// an absolute target pointed at the same file under `dir`. Everything is
/// root's: the image's user reads and runs, and writes nothing.
fn lay_out(image: &Image, dir: &Path) {
    for (path, entry) in &image.files {
        let here = dir.join(path.trim_start_matches('/'));
        match entry {
            Entry::Dir => std::fs::create_dir_all(&here).unwrap(),
            Entry::Built(_) => {
                std::fs::create_dir_all(here.parent().unwrap()).unwrap();
                std::fs::copy(env!("CARGO_BIN_EXE_slidegate"), &here).unwrap();
                std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            Entry::Link(target) => {
                std::fs::create_dir_all(here.parent().unwrap()).unwrap();
                let target = match target.strip_prefix('/') {
                    Some(inside) => dir.join(inside),
                    None => PathBuf::from(target),
                };
                std::os::unix::fs::symlink(target, &here).unwrap();
            }
        }
    }
}

/// `program` (an image path, under `dir`) run as the image's user, with
/// the image's environment and nothing of this machine's, from the image's
/// root folder.
fn as_the_image(image: &Image, dir: &Path, program: &str, args: &[String]) -> Command {
    assert!(
        uids(std::process::id()).starts_with("0 "),
        "this test switches to the image's user, so it runs as root (as CI does)"
    );
    let mut command = tool("setpriv", "apt-get install util-linux");
    command
        .args([
            format!("--reuid={}", image.user.0),
            format!("--regid={}", image.user.1),
            "--clear-groups".to_owned(),
            "--".to_owned(),
        ])
        .arg(dir.join(program.trim_start_matches('/')))
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .envs(image.env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir);
    command
}

/// The `Uid:` line of a process's status: real, effective, saved, fs.
fn uids(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
}

/// The body of an HTTP answer, as JSON.
fn body(answer: &str) -> Value {
    let (_, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{answer}"));
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

const LIMITS: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";

/// `user=alice` in the domain `edge` of [`LIMITS`], three times over `POST
/// /json`: the overall codes.
fn three_decisions(http: &str) -> Vec<String> {
    let json = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;
    (0..3)
        .map(|_| {
            let answer = common::request(http, "POST", "/json", json);
            body(&answer)["overallCode"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The image's command serves: as its user, with its environment, the
/// config folder it names empty and then filled, on the ports it exposes.
#[test]
fn the_image_serves_its_config_folder_as_its_user() {
    let image = image();
    assert!(image.user.0 != 0 && image.user.1 != 0, "the image runs as root");
    let dir = common::fresh("deploy-docker-image");
    let rootfs = dir.join("rootfs");
    lay_out(&image, &rootfs);

    // The entrypoint is the binary.
    let [program] = &image.entrypoint[..] else {
        panic!("ENTRYPOINT: {:?}", image.entrypoint)
    };
    assert!(
        matches!(resolve(&image.files, program), Some((_, Entry::Built(_)))),
        "ENTRYPOINT {program} is not the binary: {:#?}",
        image.files
    );

    // The command, moved to loopback: the listeners' ports are the
    // exposed ones; the config folder is the image's, under `rootfs`.
    assert_eq!(image.cmd.first().map(String::as_str), Some("serve"));
    let mut args = Vec::new();
    let mut ports = Vec::new();
    let mut config = None;
    let mut given = image.cmd.iter();
    while let Some(arg) = given.next() {
        args.push(arg.clone());
        match arg.as_str() {
            "--http" | "--grpc" => {
                let address = given.next().expect("an address");
                let (host, port) = address.rsplit_once(':').unwrap();
                assert_eq!(host, "0.0.0.0", "{arg} {address}: reachable from outside the container");
                ports.push(port.parse::<u16>().unwrap());
                args.push("127.0.0.1:0".to_owned());
            }
            "--config" => {
                let folder = given.next().expect("a config path");
                assert_eq!(
                    resolve(&image.files, &absolute("/", folder)).map(|(_, e)| e),
                    Some(Entry::Dir),
                    "the config folder {folder} is not in the image"
                );
                config = Some(rootfs.join(folder.trim_start_matches('/')));
                args.push(config.clone().unwrap().to_str().unwrap().to_owned());
            }
            _ => {}
        }
    }
    let config = config.expect("the command names a config folder");
    ports.sort_unstable();
    let mut exposed = image.expose.clone();
    exposed.sort_unstable();
    assert_eq!(ports, exposed, "EXPOSE and the command's listeners");
    args.extend(["--drain-delay".to_owned(), "0s".to_owned()]);

    // Nothing mounted: the start stops, saying why.
    let out = as_the_image(&image, &rootfs, program, &args).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no config file in this folder"),
        "{}",
        shown(&out)
    );

    // A config in the folder (root's, 0644, as a read-only mount shows it).
    let file = config.join("limits.yaml");
    std::fs::write(&file, LIMITS).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (child, lines) = common::spawn_logging(&mut as_the_image(&image, &rootfs, program, &args));
    let mut log = Vec::new();
    let (http, _grpc) = common::next_line(&lines, &mut log, common::listening_on);
    assert_eq!(
        uids(child.id()),
        format!("{0} {0} {0} {0}", image.user.0),
        "the process runs as the image's user"
    );
    let ready = common::request(&http, "GET", "/readyz", "");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    // slidegate's own default: a refused request is not counted.
    assert_eq!(three_decisions(&http), ["OK", "OK", "OVER_LIMIT"]);
    common::terminate(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/bin/ratelimit` is in the image and is slidegate under the name
/// `ratelimit`: started with no argument, with the image's environment and
/// envoyproxy/ratelimit's variables, as its user, it serves the config of
/// its runtime folder; with Envoy Gateway's xDS variables it starts too (no
/// variable of the image fights them).
#[test]
fn bin_ratelimit_starts_as_envoyproxy_ratelimit() {
    let image = image();
    let dir = common::fresh("deploy-docker-ratelimit");
    let rootfs = dir.join("rootfs");
    lay_out(&image, &rootfs);
    let (_, entry) = resolve(&image.files, "/bin/ratelimit").expect("/bin/ratelimit is in the image");
    let (binary, _) = resolve(&image.files, &image.entrypoint[0]).unwrap();
    assert_eq!(
        resolve(&image.files, "/bin/ratelimit").map(|(path, _)| path),
        Some(binary),
        "/bin/ratelimit is the binary: {entry:?}"
    );
    assert!(
        matches!(image.files.get("/bin/ratelimit"), Some(Entry::Link(_))),
        "/bin/ratelimit is a link, not a second copy"
    );

    // envoyproxy/ratelimit's file source: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(runtime.join("ratelimit/config")).unwrap();
    std::fs::write(runtime.join("ratelimit/config/limits.yaml"), LIMITS).unwrap();
    let mut command = as_the_image(&image, &rootfs, "/bin/ratelimit", &[]);
    command.envs(common::LOOPBACK).envs([
        ("RUNTIME_ROOT", runtime.to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("USE_STATSD", "false"),
    ]);
    let (child, lines) = common::spawn_logging(&mut command);
    let mut log = Vec::new();
    let (http, _) = common::next_line(&lines, &mut log, common::listening_on);
    assert_eq!(uids(child.id()), format!("{0} {0} {0} {0}", image.user.0));
    let ready = common::request(&http, "GET", "/healthcheck", "");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    // envoyproxy/ratelimit's default: a refused request counts too, and
    // the limit of 2 was met by the first two.
    assert_eq!(three_decisions(&http), ["OK", "OK", "OVER_LIMIT"]);
    common::terminate(child);

    // Envoy Gateway's Deployment: the config over xDS, ready before the
    // first snapshot. The control plane is a port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let xds = closed.local_addr().unwrap().to_string();
    drop(closed);
    let mut command = as_the_image(&image, &rootfs, "/bin/ratelimit", &[]);
    command.envs(common::LOOPBACK).envs([
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds.as_str()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("USE_STATSD", "false"),
    ]);
    let (child, lines) = common::spawn_logging(&mut command);
    let mut log = Vec::new();
    let (http, _) = common::next_line(&lines, &mut log, common::listening_on);
    let ready = common::request(&http, "GET", "/healthcheck", "");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    common::terminate(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The parser itself: continuations, comments inside them, exec form.
#[test]
fn the_dockerfile_parser_joins_continuations_and_skips_comments() {
    let parsed = instructions(
        "# syntax=docker/dockerfile:1\nFROM a AS b\n\nRUN one \\\n    # a comment\n    && two \\\n    three\nCMD [\"x\", \"--y\"]\n",
    );
    let shown: Vec<(&str, &str, usize)> = parsed
        .iter()
        .map(|i| (i.keyword.as_str(), i.args.as_str(), i.line))
        .collect();
    assert_eq!(
        shown,
        [
            ("FROM", "a AS b", 2),
            ("RUN", "one && two three", 4),
            ("CMD", "[\"x\", \"--y\"]", 8)
        ]
    );
    assert_eq!(exec_form(&parsed[2]), ["x", "--y"]);
    assert_eq!(absolute("/src", "./target//release/"), "/src/target/release");
}
