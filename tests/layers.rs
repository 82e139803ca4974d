//! The crate's dependencies point one way (issue 49). docs/architecture.md lists the layers,
//! top to bottom; this reads every `crate::` and `super::` path in `src/` (in `use`
//! statements, code, and macro arguments such as `tracing::info!`), outside `#[cfg(test)]`
//! items, and fails when
//!
//! - a module uses one of a higher layer (an upward import),
//! - two top-level modules use each other, directly or through others (a circle), or
//! - two source files do (a module and its own submodules excepted: a parent declares and
//!   uses its children, a child uses what its parents hold),
//!
//! naming the file, the path it uses and the way out. A test module may use anything: it is
//! not a dependency of the code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use syn::visit::Visit;

/// Where the layers are written (between the two markers), one per line, top first:
/// ``N. **Name** — `a`, `b`: what they do.``
const LAYERS_DOC: &str = "docs/architecture.md";
const BEGIN: &str = "<!-- layers: checked by tests/layers.rs -->";
const END: &str = "<!-- /layers -->";

#[test]
fn the_modules_form_the_layers_written_in_the_architecture() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join(LAYERS_DOC)).unwrap();
    let layers = parse_layers(&doc).unwrap_or_else(|e| panic!("{LAYERS_DOC}: {e}"));
    let sources = read_sources(&root.join("src"));
    assert!(
        sources.len() > 100,
        "the crate's files were read: {}",
        sources.len()
    );
    let uses = uses_of(&sources);
    assert!(
        uses.iter()
            .any(|u| u.from == "bridge" && top(&u.to) == "kafka"),
        "the paths were read (the bridge uses the Kafka runtime)"
    );
    let problems = check(&layers, &modules_declared(&sources), &uses);
    assert!(
        problems.is_empty(),
        "{} problem(s) with the layers of {LAYERS_DOC}:\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}

/// The check can fail: an upward import and a circle, each in a tree made up for it.
#[test]
fn an_upward_import_and_a_circle_are_found() {
    let layers = parse_layers(&format!(
        "{BEGIN}\n1. **Top** — `high`: uses.\n2. **Low** — `low`, `leaf`: used.\n{END}\n"
    ))
    .unwrap();
    let tree = |files: &[(&str, &str)]| -> Vec<Source> {
        files
            .iter()
            .map(|(module, text)| Source {
                file: format!("src/{module}.rs"),
                module: module.to_string(),
                text: text.to_string(),
            })
            .collect()
    };
    let declared: BTreeSet<String> = ["high", "low", "leaf"].map(String::from).into();
    let fine = tree(&[
        ("high", "use crate::low::Thing;"),
        ("low", "pub fn f() { crate::leaf::g(); }"),
        ("leaf", "#[cfg(test)] mod tests { use crate::high::X; }"),
    ]);
    assert_eq!(
        check(&layers, &declared, &uses_of(&fine)),
        Vec::<String>::new()
    );
    let upward = tree(&[
        ("high", ""),
        (
            "low",
            "fn f() { tracing::info!(x = %crate::high::name()); }",
        ),
        ("leaf", ""),
    ]);
    let problems = check(&layers, &declared, &uses_of(&upward));
    assert!(
        problems.len() == 1 && problems[0].contains("src/low.rs uses crate::high::name"),
        "{problems:?}"
    );
    let circle = tree(&[
        ("high", ""),
        ("low", "use crate::leaf::{a, b::C};"),
        ("leaf", "pub fn a() { crate::low::f() }"),
    ]);
    let problems = check(&layers, &declared, &uses_of(&circle));
    assert!(
        problems.iter().any(|p| p.contains("a circle")
            && p.contains("leaf -> low")
            && p.contains("low -> leaf")),
        "{problems:?}"
    );
}

/// The layers, top first: each a name and its top-level modules.
type Layers = Vec<(String, Vec<String>)>;

fn parse_layers(doc: &str) -> Result<Layers, String> {
    let start = doc.find(BEGIN).ok_or(format!("no `{BEGIN}`"))?;
    let end = doc.find(END).ok_or(format!("no `{END}`"))?;
    let mut layers = Layers::new();
    for line in doc[start + BEGIN.len()..end].lines() {
        // `N. **Name** — `a`, `b`: what they do.`
        let Some((head, rest)) = line.split_once(" — ") else {
            continue;
        };
        let name = head.split("**").nth(1).unwrap_or(head).to_string();
        let names = rest.split_once(": ").map_or(rest, |(names, _)| names);
        let modules: Vec<String> = names
            .split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect();
        if !modules.is_empty() {
            layers.push((name, modules));
        }
    }
    if layers.is_empty() {
        return Err("no layer between the markers".into());
    }
    Ok(layers)
}

/// One source file: its path, the module it is and its text.
struct Source {
    file: String,
    module: String,
    text: String,
}

fn read_sources(src: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .to_string();
            // The binary uses the library by its name, as any user does.
            if !rel.ends_with(".rs") || rel == "main.rs" {
                continue;
            }
            let mut parts: Vec<&str> = rel.trim_end_matches(".rs").split('/').collect();
            if matches!(parts.last(), Some(&"mod") | Some(&"lib")) {
                parts.pop();
            }
            out.push(Source {
                file: format!("src/{rel}"),
                module: parts.join("::"),
                text: std::fs::read_to_string(&path).unwrap(),
            });
        }
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    out
}

/// The top-level modules `lib.rs` declares (for a made-up tree: every top-level file).
fn modules_declared(sources: &[Source]) -> BTreeSet<String> {
    sources
        .iter()
        .filter(|s| !s.module.is_empty() && !s.module.contains("::"))
        .map(|s| s.module.clone())
        .collect()
}

/// A file module that uses another: `path` is what it wrote, resolved.
struct Use {
    file: String,
    from: String,
    to: String,
    path: String,
}

fn uses_of(sources: &[Source]) -> Vec<Use> {
    let modules: BTreeSet<&str> = sources.iter().map(|s| s.module.as_str()).collect();
    let mut uses = Vec::new();
    for source in sources {
        let parsed = syn::parse_file(&source.text)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", source.file));
        let here: Vec<String> = source
            .module
            .split("::")
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        let mut paths = Paths {
            // `super` is the module's parent, in `x.rs` as in `x/mod.rs`.
            module: here,
            found: BTreeSet::new(),
        };
        paths.visit_file(&parsed);
        for path in paths.found {
            // The longest prefix that is a file module.
            let segments: Vec<&str> = path.split("::").collect();
            let to = (1..=segments.len())
                .rev()
                .map(|n| segments[..n].join("::"))
                .find(|m| modules.contains(m.as_str()));
            let Some(to) = to else { continue };
            let from = &source.module;
            let related = to == *from
                || from.is_empty()
                || to.starts_with(&format!("{from}::"))
                || from.starts_with(&format!("{to}::"));
            if !related {
                uses.push(Use {
                    file: source.file.clone(),
                    from: from.clone(),
                    to,
                    path: format!("crate::{path}"),
                });
            }
        }
    }
    uses
}

/// Every path a file names from the crate's root, resolved to `a::b::c` (no `crate::`).
struct Paths {
    /// The module being read (inline `mod`s push onto it).
    module: Vec<String>,
    found: BTreeSet<String>,
}

impl Paths {
    /// `segments` as written, from the module being read: `crate`, `super` (repeated) or
    /// `self` first; anything else is not the crate's.
    fn add(&mut self, segments: &[String]) {
        let mut base: Vec<String> = match segments.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("super") | Some("self") => self.module.clone(),
            _ => return,
        };
        let mut rest = &segments[1..];
        if segments[0] == "super" {
            base.pop();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        base.extend(rest.iter().cloned());
        if !base.is_empty() {
            self.found.insert(base.join("::"));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.add(&full);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                full.push(r.ident.to_string());
                self.add(&full);
            }
            syn::UseTree::Glob(_) => {
                let full = prefix.clone();
                self.add(&full);
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths inside a macro's arguments (`crate :: a :: b` in its tokens).
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        // The path being read (`crate`/`super` first) and the colons since its last word.
        let mut run: Vec<String> = Vec::new();
        let mut colons = 0;
        for tree in tokens {
            match tree {
                proc_macro2::TokenTree::Ident(i) if !run.is_empty() && colons == 2 => {
                    run.push(i.to_string());
                    colons = 0;
                }
                proc_macro2::TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() => {
                    colons += 1;
                }
                other => {
                    self.end_of(&mut run);
                    colons = 0;
                    match other {
                        proc_macro2::TokenTree::Ident(i) if i == "crate" || i == "super" => {
                            run.push(i.to_string());
                        }
                        proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                        _ => {}
                    }
                }
            }
        }
        self.end_of(&mut run);
    }

    /// A path read from tokens has ended: taken if it names more than its root.
    fn end_of(&mut self, run: &mut Vec<String>) {
        let done = std::mem::take(run);
        if done.len() > 1 {
            self.add(&done);
        }
    }
}

/// `#[cfg(test)]` (or `cfg(all(test, …))`): compiled for tests only.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| match &a.meta {
        syn::Meta::List(list) if list.path.is_ident("cfg") => {
            let text = list.tokens.to_string();
            text.contains("test") && !text.contains("not (test")
        }
        _ => false,
    })
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.add(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

/// Every problem, each a paragraph saying what and where.
fn check(layers: &Layers, declared: &BTreeSet<String>, uses: &[Use]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut layer_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, (_, modules)) in layers.iter().enumerate() {
        for m in modules {
            if layer_of.insert(m, i).is_some() {
                problems.push(format!("`{m}` is in two layers"));
            }
            if !declared.contains(m) {
                problems.push(format!("`{m}` is in a layer but is no module of the crate"));
            }
        }
    }
    for m in declared {
        if !layer_of.contains_key(m.as_str()) {
            problems.push(format!(
                "`{m}` is in no layer: add it to the list in {LAYERS_DOC} where it belongs"
            ));
        }
    }
    for u in uses {
        let (Some(&from), Some(&to)) = (layer_of.get(top(&u.from)), layer_of.get(top(&u.to)))
        else {
            continue;
        };
        if to < from {
            problems.push(format!(
                "{} uses {}: `{}` ({}) may not use `{}` ({}, a higher layer). Move what it \
                 uses down to a layer both may use, or pass it in from above.",
                u.file,
                u.path,
                top(&u.from),
                layers[from].0,
                top(&u.to),
                layers[to].0
            ));
        }
    }
    let top_level: Vec<(String, String, String)> = uses
        .iter()
        .filter(|u| top(&u.from) != top(&u.to))
        .map(|u| (top(&u.from).into(), top(&u.to).into(), evidence(u)))
        .collect();
    problems.extend(circles(&top_level, "top-level modules"));
    let files: Vec<(String, String, String)> = uses
        .iter()
        .map(|u| (u.from.clone(), u.to.clone(), evidence(u)))
        .collect();
    problems.extend(circles(&files, "source files"));
    problems
}

fn evidence(u: &Use) -> String {
    format!("{} uses {}", u.file, u.path)
}

/// The circles (strongly connected sets of more than one) of the graph `edges` (from, to,
/// why), each with the edges inside it.
fn circles(edges: &[(String, String, String)], what: &str) -> Vec<String> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to, _) in edges {
        graph.entry(from).or_default().insert(to);
        graph.entry(to).or_default();
    }
    // Kosaraju: finishing order on the graph, then components on the reversed graph.
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for &start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        let mut stack = vec![(start, false)];
        while let Some((node, done)) = stack.pop() {
            if done {
                order.push(node);
                continue;
            }
            if !seen.insert(node) {
                continue;
            }
            stack.push((node, true));
            for &next in &graph[node] {
                if !seen.contains(next) {
                    stack.push((next, false));
                }
            }
        }
    }
    let mut reversed: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (&from, tos) in &graph {
        for &to in tos {
            reversed.entry(to).or_default().push(from);
        }
    }
    let mut component: BTreeMap<&str, usize> = BTreeMap::new();
    let mut count = 0;
    for &root in order.iter().rev() {
        if component.contains_key(root) {
            continue;
        }
        let mut stack = vec![root];
        while let Some(node) = stack.pop() {
            if component.insert(node, count).is_some() {
                continue;
            }
            for &prev in reversed.get(node).into_iter().flatten() {
                if !component.contains_key(prev) {
                    stack.push(prev);
                }
            }
        }
        count += 1;
    }
    let mut members: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (&node, &c) in &component {
        members.entry(c).or_default().push(node);
    }
    members
        .values()
        .filter(|m| m.len() > 1)
        .map(|m| {
            let c = component[m[0]];
            // One example per edge.
            let mut inside: BTreeMap<(&str, &str), &str> = BTreeMap::new();
            for (f, t, why) in edges {
                if component[f.as_str()] == c && component[t.as_str()] == c {
                    inside.entry((f, t)).or_insert(why);
                }
            }
            let inside: Vec<String> = inside
                .iter()
                .map(|((f, t), why)| format!("  {f} -> {t}: {why}"))
                .collect();
            format!(
                "a circle of {} {what} ({}): break it where a use points up\n{}",
                m.len(),
                m.join(", "),
                inside.join("\n")
            )
        })
        .collect()
}
