pub fn run_here(_: &std::path::Path) -> Result<(), String> { Err("todo".into()) } pub fn bundle(_: &std::path::Path, _: &std::path::Path) -> Result<(), String> { Err("todo".into()) }
