//! Named types: a schema's references to them (recursive types, a registry schema's
//! references) resolved only when one is met.

use super::mismatch::Path;
use super::Mismatch;
use apache_avro::schema::{Name, NamesRef, ResolvedSchema};
use apache_avro::Schema;
use std::cell::OnceCell;

/// The named types of the root schema, resolved only when a `Schema::Ref` is met (most
/// schemas have none, and then cost nothing).
pub(super) struct Names<'s> {
    root: &'s Schema,
    /// Schemas that define types `root` refers to (a registry schema's references).
    references: &'s [Schema],
    map: OnceCell<Option<NamesRef<'s>>>,
}

impl<'s> Names<'s> {
    pub(super) fn new(root: &'s Schema) -> Self {
        Self::with_references(root, &[])
    }

    pub(super) fn with_references(root: &'s Schema, references: &'s [Schema]) -> Self {
        Names {
            root,
            references,
            map: OnceCell::new(),
        }
    }

    /// `schema`, or the named type it refers to.
    pub(super) fn resolve(
        &self,
        schema: &'s Schema,
        namespace: Option<&str>,
        path: &Path,
    ) -> Result<&'s Schema, Mismatch> {
        let mut schema = schema;
        while let Schema::Ref { name } = schema {
            let map = self.map.get_or_init(|| {
                // The referenced schemas first: apache-avro resolves in order.
                let all = self.references.iter().chain([self.root]).collect();
                ResolvedSchema::new_with_schemata(all)
                    .ok()
                    .map(|resolved| resolved.get_names().clone())
            });
            let full: Name = name.fully_qualified_name(namespace).into_owned();
            schema = map
                .as_ref()
                .and_then(|names| names.get(&full).copied())
                .ok_or_else(|| {
                    path.mismatch(format!(
                        "the schema refers to `{}`, which it does not define",
                        full.fullname(None)
                    ))
                })?;
        }
        Ok(schema)
    }
}

/// The namespace inside a named schema, for references in it.
pub(super) fn inner_namespace<'s>(name: &'s Name, enclosing: Option<&'s str>) -> Option<&'s str> {
    name.namespace().or(enclosing)
}
