//! # stretto-optim
//!
//! Stretto's global cascade optimizer. Given a *profile* (what every physical operator said about a sample of
//! tuples, `stretto.profile/v1`) and precision/recall targets with a credible level, it returns the cheapest
//! cascade plan (`stretto.plan/v1`) that it can **certify** to meet both targets for the whole query.
//!
//! - [`profile`]: reading and validating profiles; [`problem`]: a profile compiled into ladders, with exact (hard)
//!   plan evaluation; [`replay`]: a plan's precision, recall and cost on a profile.
//! - [`soft`]: the relaxed cascade (sigmoid pick factors, softmax decisions, global soft counts without
//!   independence assumptions) with a hand-written gradient; [`bounds`]: Beta credible bounds and the joint
//!   posterior probability of meeting both targets.
//! - [`solver`]: projected Adam as an `argmin` solver, restarts in parallel (rayon), the annealing schedule and
//!   temperature-0 extraction; [`search`]: a coordinate search over one cheap stage per filter or map, the
//!   solver's companion at high targets and where the relaxation keeps a map at gold; [`order`]: stage ordering by dynamic programming.
//! - [`strategy`]: the certified `global` strategy, whose candidate solves and coordinate searches run at once, and
//!   the baselines `local`, `independent`, `lotus`, `abacus`, `gold`, behind one [`Strategy`](strategy::Strategy)
//!   trait.
//! - [`workload`] and [`evaluation`]: generated workloads and the optimize-on-sample, replay-on-population
//!   measurement.
//!
//! ```
//! use stretto_optim::problem::Problem;
//! use stretto_optim::strategy::{strategy, Targets};
//! use stretto_optim::workload::{generate, WorkloadConfig};
//!
//! let workload = generate(3, &WorkloadConfig { population: Some(2000), operators: Some(2), ..Default::default() });
//! let problem = Problem::from_profile(&workload.sample)?;
//! let plan = strategy("global")?.optimize(&problem, &Targets::new(0.7, 0.7, 0.95)?, 0)?;
//! // Either a certified plan or the gold fallback, never an uncertified cheaper one.
//! assert!(plan.fell_back_to_gold || (plan.precision_lower_bound >= 0.7 && plan.recall_lower_bound >= 0.7));
//! let file = plan.to_plan_file(&problem);
//! assert_eq!(file.format, "stretto.plan/v1");
//! # Ok::<(), stretto_optim::OptimError>(())
//! ```

#![warn(missing_docs)]

pub mod bounds;
pub mod error;
pub mod evaluation;
pub mod order;
pub mod problem;
pub mod profile;
pub mod replay;
pub mod search;
pub mod soft;
pub mod solver;
pub mod strategy;
pub mod workload;

pub use error::{OptimError, Result};
