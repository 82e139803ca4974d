//! The `rel="next"` target of an RFC 8288 `Link` header, e.g.
//! `<https://api.example/items?page=2>; rel="next", <…?page=9>; rel="last"`.
//!
//! Written by hand because it is small: a link is `<URI-reference>` followed by `;`-separated
//! parameters, links are separated by commas, and commas may appear inside the `<…>` and
//! inside quoted parameter values, so a plain split on `,` is wrong.

/// The first link whose `rel` includes `next` (relation types are a space-separated,
/// case-insensitive list), across all `Link` header values.
pub fn next_link<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<String> {
    values.into_iter().find_map(|v| {
        links(v)
            .into_iter()
            .find(|(_, rels)| {
                rels.split_ascii_whitespace()
                    .any(|r| r.eq_ignore_ascii_case("next"))
            })
            .map(|(target, _)| target)
    })
}

/// Every `(target, rel)` in one header value; malformed parts are skipped.
fn links(value: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = value;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        let Some(after) = rest.strip_prefix('<') else {
            return out;
        };
        let Some(end) = after.find('>') else {
            return out;
        };
        let target = after[..end].trim().to_string();
        rest = &after[end + 1..];
        let mut rel = String::new();
        // Parameters: `; name=value` or `; name="quoted, value"`, up to the next top-level comma.
        loop {
            rest = rest.trim_start_matches([' ', '\t']);
            let Some(after) = rest.strip_prefix(';') else {
                break;
            };
            let after = after.trim_start_matches([' ', '\t']);
            let name_end = after.find(['=', ';', ',']).unwrap_or(after.len());
            let name = after[..name_end].trim();
            rest = &after[name_end..];
            let mut value = String::new();
            if let Some(after) = rest.strip_prefix('=') {
                let after = after.trim_start_matches([' ', '\t']);
                if let Some(quoted) = after.strip_prefix('"') {
                    // Quoted string with backslash escapes.
                    let mut chars = quoted.char_indices();
                    let mut consumed = quoted.len();
                    while let Some((i, c)) = chars.next() {
                        match c {
                            '\\' => {
                                if let Some((_, e)) = chars.next() {
                                    value.push(e);
                                }
                            }
                            '"' => {
                                consumed = i + 1;
                                break;
                            }
                            c => value.push(c),
                        }
                    }
                    rest = &quoted[consumed..];
                } else {
                    let end = after.find([';', ',']).unwrap_or(after.len());
                    value = after[..end].trim().to_string();
                    rest = &after[end..];
                }
            }
            if name.eq_ignore_ascii_case("rel") && rel.is_empty() {
                rel = value;
            }
        }
        out.push((target, rel));
        // Skip anything malformed up to the next link.
        match rest.find(',') {
            Some(i) if !rest.trim_start().starts_with('<') => rest = &rest[i..],
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_next_among_several_links() {
        let v = r#"<https://api.example/items?page=1>; rel="prev", <https://api.example/items?page=3&f=a,b>; rel="next", <https://api.example/items?page=9>; rel=last"#;
        assert_eq!(
            next_link([v]).as_deref(),
            Some("https://api.example/items?page=3&f=a,b")
        );
    }

    #[test]
    fn rel_is_a_case_insensitive_list_and_may_be_unquoted() {
        assert_eq!(
            next_link([r#"</p2>; rel="Next last""#]).as_deref(),
            Some("/p2")
        );
        assert_eq!(next_link(["</p2>;rel=next"]).as_deref(), Some("/p2"));
        assert_eq!(
            next_link([r#"</a>; title="x, rel=next"; rel="prev", </b>; rel="next""#]).as_deref(),
            Some("/b")
        );
    }

    #[test]
    fn looks_across_header_values_and_ignores_garbage() {
        assert_eq!(
            next_link(["</a>; rel=prev", "</b>; rel=next"]).as_deref(),
            Some("/b")
        );
        assert_eq!(next_link(["garbage", "</b>; rel=prev"]), None);
        assert_eq!(next_link(["<unclosed; rel=next"]), None);
        assert_eq!(next_link([""]), None);
    }
}
