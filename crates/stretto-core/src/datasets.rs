//! The bundled benchmark datasets (real data, see `data/README.md` for provenance), loadable by name.
//!
//! The data lives in the repository's `data/` folder. At run time it is found through `STRETTO_DATA_DIR` when set,
//! else at the path the crate was built from, so `cargo run` and `cargo test` work from a clone without set-up.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{Int64Type, Schema};

use crate::error::{CoreError, Result};
use crate::table::{load_csv, ColumnKind, TableSchema};

/// Environment variable that overrides where the bundled data is read from.
pub const DATA_DIR_ENV: &str = "STRETTO_DATA_DIR";

/// The folder holding the bundled datasets.
pub fn data_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os(DATA_DIR_ENV) {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data"),
    };
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(CoreError::Io {
            path: dir,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("bundled data folder not found; set {DATA_DIR_ENV} to the repository's data/ folder"),
            ),
        })
    }
}

/// One table of a bundled dataset.
#[derive(Debug, Clone, Copy)]
pub struct TableSpec {
    /// Name used in predicates (`{reviews.reviewtext}`).
    pub name: &'static str,
    /// CSV file, relative to the data folder.
    pub file: &'static str,
    /// Kinds of the columns that are not plain text.
    pub kinds: &'static [(&'static str, ColumnKind)],
    /// Optional photo column derived from an id column: (id column, image folder, new column name).
    pub photos: Option<(&'static str, &'static str, &'static str)>,
    /// What the table is, in a few words.
    pub about: &'static str,
}

/// A bundled dataset: a main table plus side tables (labels, ground truth, relations).
#[derive(Debug, Clone, Copy)]
pub struct DatasetSpec {
    /// Dataset name (`movie`, `email`, ...).
    pub name: &'static str,
    /// What it is.
    pub about: &'static str,
    /// Its tables; the first is the one semantic queries run over by default.
    pub tables: &'static [TableSpec],
}

use ColumnKind::{Boolean, Image, Integer, Number};

/// Every bundled dataset.
pub const DATASETS: &[DatasetSpec] = &[
    DatasetSpec {
        name: "movie",
        about: "Rotten Tomatoes critic reviews (SemBench)",
        tables: &[
            TableSpec {
                name: "reviews",
                file: "movie/reviews_1000.csv",
                kinds: &[("reviewid", Integer), ("istopcritic", Boolean)],
                photos: None,
                about: "critic reviews with text and sentiment",
            },
            TableSpec {
                name: "labels",
                file: "movie/movie_reviews_1000_labels_derived.csv",
                kinds: &[
                    ("_index_reviews", Integer),
                    ("reviewid", Integer),
                    ("is_positive", Integer),
                    ("is_negative", Integer),
                ],
                photos: None,
                about: "derived sentiment labels",
            },
            TableSpec {
                name: "gt_q1",
                file: "movie/gt_Q1_1000.csv",
                kinds: &[("reviewId", Integer)],
                photos: None,
                about: "SemBench Q1 answer",
            },
            TableSpec {
                name: "gt_q2",
                file: "movie/gt_Q2_1000.csv",
                kinds: &[("reviewId", Integer)],
                photos: None,
                about: "SemBench Q2 answer",
            },
        ],
    },
    DatasetSpec {
        name: "email",
        about: "Enron emails (palimpzest test data)",
        tables: &[
            TableSpec {
                name: "emails",
                file: "email/emails.csv",
                kinds: &[("id", Integer)],
                photos: None,
                about: "raw emails with headers",
            },
            TableSpec {
                name: "labels",
                file: "email/enron-eval_labels.csv",
                kinds: &[("_index_emails", Integer), ("mentions_entity", Integer), ("fraudulent", Integer)],
                photos: None,
                about: "sender, mentions_entity, fraudulent",
            },
        ],
    },
    DatasetSpec {
        name: "rotowire",
        about: "NBA game reports with player and team tables",
        tables: &[
            TableSpec {
                name: "reports",
                file: "rotowire/reports.csv",
                kinds: &[("game_id", Integer)],
                photos: None,
                about: "game reports",
            },
            TableSpec {
                name: "players",
                file: "rotowire/players.csv",
                kinds: &[("height", Number)],
                photos: None,
                about: "players",
            },
            TableSpec {
                name: "teams",
                file: "rotowire/teams.csv",
                kinds: &[("founded", Integer)],
                photos: None,
                about: "teams",
            },
            TableSpec {
                name: "players_to_games",
                file: "rotowire/players_to_games.csv",
                kinds: &[("game_id", Integer)],
                photos: None,
                about: "player-game relation",
            },
            TableSpec {
                name: "teams_to_games",
                file: "rotowire/teams_to_games.csv",
                kinds: &[("game_id", Integer)],
                photos: None,
                about: "team-game relation",
            },
            TableSpec {
                name: "player_labels",
                file: "rotowire/rotowire_players_ground_truth.csv",
                kinds: &[
                    ("_index_reports", Integer),
                    ("_index_players", Integer),
                    ("Assists", Number),
                    ("Blocks", Number),
                    ("Minutes played", Number),
                    ("Points", Number),
                    ("Total rebounds", Number),
                    ("Steals", Number),
                ],
                photos: None,
                about: "box-score ground truth per player-game",
            },
            TableSpec {
                name: "team_labels",
                file: "rotowire/rotowire_teams_ground_truth.csv",
                kinds: &[
                    ("game_id", Integer),
                    ("_index_team", Integer),
                    ("Losses", Number),
                    ("Total points", Number),
                    ("Points in 4th quarter", Number),
                    ("Wins", Number),
                ],
                photos: None,
                about: "box-score ground truth per team-game",
            },
        ],
    },
    DatasetSpec {
        name: "ecommerce",
        about: "Myntra fashion products with descriptions and photos",
        tables: &[
            TableSpec {
                name: "products",
                file: "ecommerce/ecommerce_products_large.csv",
                kinds: &[("id", Integer), ("year", Integer)],
                photos: Some(("id", "ecommerce/images", "photo")),
                about: "catalog rows; `photo` is the local image where one is bundled",
            },
            TableSpec {
                name: "labels",
                file: "ecommerce/ecommerce_labels_derived.csv",
                kinds: &[
                    ("_index_products", Integer),
                    ("id", Integer),
                    ("is_tshirt_or_top", Integer),
                    ("is_menswear", Integer),
                    ("carries_objects", Integer),
                    ("is_footwear", Integer),
                ],
                photos: None,
                about: "labels derived from catalog columns",
            },
            TableSpec {
                name: "image_availability",
                file: "ecommerce/image_availability.csv",
                kinds: &[("_index_products", Integer), ("id", Integer), ("has_image_offline", Integer)],
                photos: None,
                about: "which products have a bundled photo",
            },
        ],
    },
    DatasetSpec {
        name: "artwork",
        about: "paintings table (images are Wikimedia URLs, not bundled)",
        tables: &[
            TableSpec {
                name: "paintings",
                file: "artwork/paintings_medium.csv",
                kinds: &[("image_url", Image)],
                photos: None,
                about: "paintings",
            },
            TableSpec {
                name: "sample",
                file: "artwork/paintings_sampled_no_duplicated.csv",
                kinds: &[("image_url", Image)],
                photos: None,
                about: "65 labelled paintings",
            },
            TableSpec {
                name: "labels",
                file: "artwork/artwork_no_duplicated.csv",
                kinds: &[
                    ("_index_artworks", Integer),
                    ("m&c", Integer),
                    ("more_than_2_people", Integer),
                    ("more_than_3_people", Integer),
                    ("saints_with_halos", Integer),
                    ("death_theme", Integer),
                    ("century", Integer),
                ],
                photos: None,
                about: "human labels for the sample",
            },
        ],
    },
];

/// The spec of a bundled dataset.
pub fn dataset_spec(name: &str) -> Result<&'static DatasetSpec> {
    DATASETS.iter().find(|d| d.name == name).ok_or_else(|| CoreError::UnknownDataset {
        name: name.to_string(),
        known: DATASETS.iter().map(|d| d.name).collect::<Vec<_>>().join(", "),
    })
}

/// A loaded dataset: named tables with unqualified column names.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Dataset name.
    pub name: String,
    /// Tables in the spec's order (the first is the main one).
    pub tables: BTreeMap<String, RecordBatch>,
    order: Vec<String>,
}

impl Dataset {
    /// Loads a bundled dataset by name from [`data_dir`].
    pub fn load(name: &str) -> Result<Self> {
        Self::load_from(name, &data_dir()?)
    }

    /// Loads a bundled dataset from an explicit data folder.
    pub fn load_from(name: &str, dir: &Path) -> Result<Self> {
        let spec = dataset_spec(name)?;
        let _span = tracing::info_span!("load_dataset", dataset = name).entered();
        let mut tables = BTreeMap::new();
        let mut order = Vec::new();
        for t in spec.tables {
            tables.insert(t.name.to_string(), load_table(t, dir)?);
            order.push(t.name.to_string());
        }
        Ok(Self { name: name.to_string(), tables, order })
    }

    /// The main table (the one semantic queries run over by default) and its name.
    pub fn main_table(&self) -> (&str, &RecordBatch) {
        let name = &self.order[0];
        (name, &self.tables[name])
    }

    /// A table by name.
    pub fn table(&self, table: &str) -> Result<&RecordBatch> {
        self.tables.get(table).ok_or_else(|| CoreError::UnknownTable {
            dataset: self.name.clone(),
            table: table.to_string(),
            known: self.order.join(", "),
        })
    }

    /// The dataset's spelling of table `name`, matched in any case (as a query may write it); `name` itself where
    /// no table matches, for the lookup that follows to report.
    pub fn table_spelling<'a>(&'a self, name: &'a str) -> &'a str {
        self.order.iter().find(|n| n.eq_ignore_ascii_case(name)).map_or(name, String::as_str)
    }

    /// Table names in the spec's order.
    pub fn table_names(&self) -> &[String] {
        &self.order
    }
}

/// Loads one table of a spec, adding its photo column when it has one. HTML entities in its text (`&apos;`,
/// `&#8217;`, `&nbsp;`: the scraped sources kept them) are decoded, so models read the text a person would.
pub fn load_table(spec: &TableSpec, dir: &Path) -> Result<RecordBatch> {
    let schema = spec.kinds.iter().fold(TableSchema::new(), |s, (c, k)| s.with(*c, *k));
    let batch = decode_entities(load_csv(dir.join(spec.file), &schema)?)?;
    match spec.photos {
        None => Ok(batch),
        Some((id_col, folder, column)) => add_photo_column(batch, id_col, &dir.join(folder), column),
    }
}

/// `batch` with the HTML entities of its string columns decoded.
fn decode_entities(batch: RecordBatch) -> Result<RecordBatch> {
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.as_string_opt::<i32>() {
            Some(s) if s.iter().flatten().any(|v| v.contains('&')) => Arc::new(
                s.iter()
                    .map(|v| v.map(|v| html_escape::decode_html_entities(v).replace('\u{a0}', " ")))
                    .collect::<StringArray>(),
            ) as ArrayRef,
            _ => c.clone(),
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns)
        .map_err(|source| CoreError::Arrow { context: "decoding HTML entities".into(), source })
}

/// Adds an image column holding `folder/<id>.jpg` where that file exists and null elsewhere.
fn add_photo_column(batch: RecordBatch, id_col: &str, folder: &Path, column: &str) -> Result<RecordBatch> {
    let ids = batch.column_by_name(id_col).ok_or_else(|| CoreError::MissingColumn {
        column: id_col.to_string(),
        context: "photo id column".into(),
        available: batch.schema().fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", "),
    })?;
    let ids = ids
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| CoreError::InvalidLogicalPlan(format!("photo id column {id_col} must be an integer")))?;
    let paths: StringArray = (0..ids.len())
        .map(|i| {
            if ids.is_null(i) {
                return None;
            }
            let p = folder.join(format!("{}.jpg", ids.value(i)));
            p.is_file().then(|| p.to_string_lossy().into_owned())
        })
        .collect();
    let mut fields: Vec<_> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(ColumnKind::Image.field(column));
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(paths));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| CoreError::arrow("adding photo column", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_dataset_loads_with_expected_rows() {
        let expected = [("movie", 1000), ("email", 1000), ("rotowire", 728), ("ecommerce", 1000), ("artwork", 1000)];
        for (name, rows) in expected {
            let ds = Dataset::load(name).unwrap();
            assert_eq!(ds.main_table().1.num_rows(), rows, "{name}");
        }
    }

    #[test]
    fn ecommerce_photos_point_at_bundled_files() {
        let ds = Dataset::load("ecommerce").unwrap();
        let photos = ds.main_table().1.column_by_name("photo").unwrap().as_string::<i32>().clone();
        let present = photos.iter().flatten().count();
        assert_eq!(present, 232);
        assert!(photos.iter().flatten().all(|p| Path::new(p).is_file()));
    }

    #[test]
    fn bundled_text_reads_without_html_entities() {
        let ds = Dataset::load("movie").unwrap();
        let text = ds.table("reviews").unwrap().column_by_name("reviewtext").unwrap().as_string::<i32>().clone();
        let entity = regex_lite_entity();
        assert!(text.iter().flatten().all(|t| !entity(t)), "an HTML entity survived loading");
        // The file itself has them (`&apos;`, `&#8217;`, `&#44;`...): they were decoded, not absent.
        let raw = std::fs::read_to_string(data_dir().unwrap().join("movie/reviews_1000.csv")).unwrap();
        assert!(raw.contains("&apos;") && raw.contains("&#8217;"));
        assert!(text.iter().flatten().any(|t| t.contains('\u{2019}')), "&#8217; became a right quote");
    }

    /// Whether a text holds `&name;` or `&#digits;`.
    fn regex_lite_entity() -> impl Fn(&str) -> bool {
        |t: &str| {
            t.match_indices('&').any(|(i, _)| {
                let rest = &t[i + 1..];
                let end = rest.find(';').filter(|&e| e > 0 && e <= 8);
                end.is_some_and(|e| rest[..e].trim_start_matches('#').chars().all(|c| c.is_ascii_alphanumeric()))
            })
        }
    }

    #[test]
    fn unknown_dataset_lists_known_ones() {
        let err = Dataset::load("nope").unwrap_err().to_string();
        assert!(err.contains("nope") && err.contains("movie") && err.contains("artwork"), "{err}");
    }
}
