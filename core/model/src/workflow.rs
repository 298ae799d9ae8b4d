//! Workflows' pure rules: a dependency failure policy, and a graph request checked (names,
//! references, cycles) before anything of it is stored.

use std::collections::HashMap;

use bson::oid::ObjectId;

/// Most tasks one graph or batch request creates, and most dependencies one task names: a
/// waiting task holds its dependencies' ids twice (`depends_on`, `waiting_on`), 20 000 of
/// them under 1 MB, far below MongoDB's 16 MB document limit.
pub const MAX_WORKFLOW_TASKS: usize = 20_000;

/// What becomes of a waiting task when a task it waits for fails or is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDependencyFailure {
    /// Cancelled, with the reason, and so in turn everything that waits on it that cancels.
    #[default]
    Cancel,
    /// Run anyway once every dependency has ended, however it ended.
    Run,
}

impl OnDependencyFailure {
    pub fn parse(s: &str) -> Result<OnDependencyFailure, String> {
        match s {
            "cancel" => Ok(OnDependencyFailure::Cancel),
            "run" => Ok(OnDependencyFailure::Run),
            other => Err(format!(
                "on_dependency_failure must be \"cancel\" or \"run\", not {other:?}"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OnDependencyFailure::Cancel => "cancel",
            OnDependencyFailure::Run => "run",
        }
    }
}

/// What a graph node names as a dependency: another node of the same request by its name, or
/// a task that already exists by its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DependencyRef {
    Name(String),
    Task(ObjectId),
}

/// One task of a graph request, as the client wrote it (queue still unresolved).
#[derive(Debug, Clone, PartialEq)]
pub struct GraphNode {
    pub name: String,
    pub depends_on: Vec<DependencyRef>,
}

/// A checked graph: its nodes in an order where every node comes after those it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphOrder {
    /// Indexes into the request's nodes, dependencies first.
    pub order: Vec<usize>,
    /// Per node, the indexes of the nodes of the request it waits for (deduplicated).
    pub waits_for: Vec<Vec<usize>>,
}

/// Checks a graph: names present and distinct, every name it refers to defined, no cycle.
/// The error says which node and which name, so the client can fix the request.
pub fn check_graph(nodes: &[GraphNode]) -> Result<GraphOrder, String> {
    if nodes.is_empty() {
        return Err("a graph needs at least one task".into());
    }
    if nodes.len() > MAX_WORKFLOW_TASKS {
        return Err(format!(
            "a graph holds at most {MAX_WORKFLOW_TASKS} tasks, not {}",
            nodes.len()
        ));
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        if n.name.is_empty() {
            return Err(format!("tasks[{i}]: name must be a non-empty string"));
        }
        if let Some(first) = index.insert(n.name.as_str(), i) {
            return Err(format!(
                "tasks[{i}]: name {:?} is already the name of tasks[{first}]",
                n.name
            ));
        }
    }
    let mut waits_for = Vec::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        let mut deps: Vec<usize> = Vec::new();
        // A fan-in names thousands: a set, not a scan of `deps`, finds repeats.
        let mut seen = std::collections::HashSet::new();
        for d in &n.depends_on {
            let DependencyRef::Name(name) = d else {
                continue;
            };
            match index.get(name.as_str()) {
                Some(&j) if j == i => {
                    return Err(format!("tasks[{i}] ({:?}) depends on itself", n.name))
                }
                Some(&j) => {
                    if seen.insert(j) {
                        deps.push(j);
                    }
                }
                None => {
                    return Err(format!(
                    "tasks[{i}] ({:?}) depends on {name:?}, which no task of the graph is named",
                    n.name
                ))
                }
            }
        }
        waits_for.push(deps);
    }
    let order = topological_order(&waits_for).map_err(|cycle| {
        let names: Vec<&str> = cycle.iter().map(|&i| nodes[i].name.as_str()).collect();
        format!("the graph has a cycle: {}", names.join(" → "))
    })?;
    Ok(GraphOrder { order, waits_for })
}

/// Kahn's order, or a cycle (its nodes in order, the first repeated at the end).
fn topological_order(waits_for: &[Vec<usize>]) -> Result<Vec<usize>, Vec<usize>> {
    let n = waits_for.len();
    let mut waiting: Vec<usize> = waits_for.iter().map(Vec::len).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, deps) in waits_for.iter().enumerate() {
        for &d in deps {
            dependents[d].push(i);
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop() {
        order.push(i);
        for &d in &dependents[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.push(d);
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every node left waits on another node left: walk back from one until a node repeats.
    let Some(start) = (0..n).find(|&i| waiting[i] > 0) else {
        return Err(Vec::new());
    };
    let mut seen: HashMap<usize, usize> = HashMap::new();
    let mut path = Vec::new();
    let mut at = start;
    while let std::collections::hash_map::Entry::Vacant(v) = seen.entry(at) {
        v.insert(path.len());
        path.push(at);
        match waits_for[at].iter().find(|&&d| waiting[d] > 0) {
            Some(&next) => at = next,
            None => return Err(path),
        }
    }
    let from = seen.get(&at).copied().unwrap_or(0);
    let mut cycle: Vec<usize> = path[from..].to_vec();
    cycle.reverse();
    if let Some(&first) = cycle.first() {
        cycle.push(first);
    }
    Err(cycle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, deps: &[&str]) -> GraphNode {
        GraphNode {
            name: name.into(),
            depends_on: deps
                .iter()
                .map(|d| DependencyRef::Name(d.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_diamond_is_ordered_dependencies_first() {
        let g = check_graph(&[
            node("merge", &["left", "right"]),
            node("left", &["split"]),
            node("right", &["split", "split"]),
            node("split", &[]),
        ])
        .expect("a diamond is a graph");
        let pos = |i: usize| g.order.iter().position(|&o| o == i).expect("ordered");
        assert!(pos(3) < pos(1) && pos(3) < pos(2));
        assert!(pos(1) < pos(0) && pos(2) < pos(0));
        assert_eq!(g.waits_for[2], vec![3], "a repeated name counts once");
    }

    #[test]
    fn cycles_unknown_names_and_duplicates_are_refused_by_name() {
        let e = check_graph(&[node("a", &["c"]), node("b", &["a"]), node("c", &["b"])])
            .expect_err("a cycle");
        assert!(e.contains("cycle") && e.contains("a → "), "{e}");
        let e = check_graph(&[node("a", &["nope"])]).expect_err("unknown");
        assert!(e.contains("\"nope\""), "{e}");
        let e = check_graph(&[node("a", &[]), node("a", &[])]).expect_err("twice");
        assert!(e.contains("tasks[1]") && e.contains("tasks[0]"), "{e}");
        let e = check_graph(&[node("a", &["a"])]).expect_err("self");
        assert!(e.contains("itself"), "{e}");
        assert!(check_graph(&[]).is_err());
    }

    #[test]
    fn existing_tasks_are_not_graph_names() {
        let g = check_graph(&[GraphNode {
            name: "a".into(),
            depends_on: vec![DependencyRef::Task(ObjectId::new())],
        }])
        .expect("an existing task is no name to resolve");
        assert!(g.waits_for[0].is_empty());
    }

    #[test]
    fn the_policy_has_two_names() {
        assert_eq!(
            OnDependencyFailure::parse("run"),
            Ok(OnDependencyFailure::Run)
        );
        assert_eq!(
            OnDependencyFailure::parse("cancel").map(|p| p.name()),
            Ok("cancel")
        );
        assert!(OnDependencyFailure::parse("ignore").is_err());
    }
}
