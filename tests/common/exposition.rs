//! A parser of the Prometheus text exposition for tests, strict where Prometheus is: a page
//! with an unparsable line, a duplicate label name or a duplicate series fails the test, since
//! Prometheus would reject the whole scrape.

use std::collections::BTreeMap;

/// One sample of the exposition.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    pub text: String,
}

impl Metrics {
    /// Parses a page, failing the test on anything Prometheus would reject the scrape for:
    /// unparsable lines, duplicate label names, duplicate series.
    pub fn parse(text: &str) -> Metrics {
        let samples: Vec<Sample> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| parse_sample(l).unwrap_or_else(|| panic!("unparsable sample line: {l}")))
            .collect();
        let mut seen = std::collections::HashSet::new();
        for s in &samples {
            assert!(
                seen.insert((s.name.clone(), s.labels.clone())),
                "duplicate series: {} {:?}",
                s.name,
                s.labels
            );
        }
        Metrics {
            samples,
            text: text.to_string(),
        }
    }

    /// Samples of `name` whose labels include every `(key, value)` in `matchers`.
    pub fn find(&self, name: &str, matchers: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                matchers
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The one value of `name` matching `matchers`; `None` if absent, panics if ambiguous.
    pub fn value(&self, name: &str, matchers: &[(&str, &str)]) -> Option<f64> {
        let found = self.find(name, matchers);
        assert!(
            found.len() <= 1,
            "{name}{matchers:?} matches {} series",
            found.len()
        );
        found.first().map(|s| s.value)
    }

    pub fn get(&self, name: &str, matchers: &[(&str, &str)]) -> f64 {
        self.value(name, matchers)
            .unwrap_or_else(|| panic!("{name}{matchers:?} is absent"))
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let Some(open) = line.find('{') else {
        let (n, v) = line.split_once(' ')?;
        return Some(Sample {
            name: n.to_string(),
            labels: BTreeMap::new(),
            value: parse_value(v.trim())?,
        });
    };
    let bytes = line.as_bytes();
    let mut labels = BTreeMap::new();
    let mut i = open + 1;
    loop {
        while i < bytes.len() && (bytes[i] == b',' || bytes[i] == b' ') {
            i += 1;
        }
        if bytes.get(i)? == &b'}' {
            break;
        }
        let eq = i + line[i..].find('=')?;
        let key = line[i..eq].to_string();
        if bytes.get(eq + 1)? != &b'"' {
            return None;
        }
        let mut value = String::new();
        let mut j = eq + 2;
        loop {
            match *bytes.get(j)? {
                b'\\' => {
                    value.push(match *bytes.get(j + 1)? {
                        b'n' => '\n',
                        other => other as char,
                    });
                    j += 2;
                }
                b'"' => break,
                _ => {
                    let ch = line[j..].chars().next()?;
                    value.push(ch);
                    j += ch.len_utf8();
                }
            }
        }
        if labels.insert(key.clone(), value).is_some() {
            // Prometheus rejects the whole scrape for this.
            panic!("duplicate label name '{key}' in: {line}");
        }
        i = j + 1;
    }
    let value = line[i + 1..].trim().split(' ').next()?;
    Some(Sample {
        name: line[..open].to_string(),
        labels,
        value: parse_value(value)?,
    })
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}
