//! Tests of `plan`.

use clap::Parser;

use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    plan: PlanArgs,
}

fn args(line: &[&str]) -> PlanArgs {
    Cli::try_parse_from(std::iter::once("plan").chain(line.iter().copied())).unwrap().plan
}

#[test]
fn flags_win_over_measured_rates_and_measured_over_defaults() {
    let measured = Measured {
        card: [20.0, 21.0, 12.0],
        host_gbps: Some(100.0),
        handoff_us: 9.5,
        dram_gbps: 180.0,
        op_us: 4.0,
        cards: 4,
    };
    let rates = args(&["--ranks", "4", "--d2h", "30", "--handoff-us", "0"]).rates(Some(&measured), None).unwrap();
    let m = rates.machine;
    assert_eq!((m.h2d_gbps, m.d2h_gbps, m.duplex_gbps, m.host_gbps), (20.0, 30.0, 12.0, 100.0));
    assert_eq!((m.dram_gbps, m.handoff_us, m.op_us), (180.0, 0.0, 4.0));
    let (default, flag, measured_here) = (Source::Default, Source::Flag, Source::Measured);
    assert_eq!(rates.sources, [measured_here, flag, measured_here, measured_here, measured_here, flag, measured_here]);
    let rates = args(&["--ranks", "4", "--op-us", "7.5"]).rates(Some(&measured), None).unwrap();
    assert_eq!((rates.machine.op_us, rates.sources[6]), (7.5, flag));
    assert_eq!(args(&["--ranks", "4"]).rates(None, None).unwrap().machine.op_us, cost::OP_US, "the fit by default");
    let rates = args(&["--ranks", "4", "--dram", "90"]).rates(Some(&measured), None).unwrap();
    assert_eq!((rates.machine.dram_gbps, rates.sources[4]), (90.0, flag));
    let one_card = Measured { host_gbps: None, cards: 1, ..measured };
    let rates = args(&["--ranks", "4"]).rates(Some(&one_card), None).unwrap();
    assert_eq!((rates.machine.host_gbps, rates.sources[3]), (cost::H200_HOST_GBPS, default));
    assert_eq!(
        rates.measured_on.as_deref(),
        Some("on 1 card; DRAM with every core copying beside the first card's DMAs")
    );
    assert_eq!((rates.machine.handoff_us, rates.sources[5]), (9.5, measured_here));
    let rates = args(&["--ranks", "8"]).rates(Some(&Measured { cards: 8, ..measured }), None).unwrap();
    let text = render(&rates, &[], None);
    assert!(
        text.contains(
            "measured here (the slowest of 8 cards; the host with all 8 at once; the handoff and an operation on \
             the first; DRAM with every core copying beside the first card's DMAs): h2d, d2h, duplex, host, dram, handoff-us, op-us"
        ),
        "{text}"
    );
}

#[test]
fn bad_ranks_and_rates_are_refused_naming_their_flag() {
    for (line, names) in [
        (&["--ranks", "1"][..], "--ranks 1"),
        (&["--ranks", "0"], "--ranks 0"),
        (&["--ranks", "8", "--duplex", "0"], "--duplex 0"),
        (&["--ranks", "8", "--host=-5"], "--host -5"),
        (&["--ranks", "8", "--dram", "inf"], "--dram inf"),
        (&["--ranks", "8", "--handoff-us", "NaN"], "--handoff-us NaN"),
        (&["--ranks", "8", "--op-us=-1"], "--op-us -1"),
    ] {
        let Err(CliError::Usage(message)) = args(line).rates(None, None) else { panic!("{line:?} accepted") };
        assert!(message.starts_with(names), "{line:?}: {message}");
    }
    assert!(args(&["--ranks", "8", "--handoff-us", "0"]).rates(None, None).is_ok(), "no handoff cost is a model too");
    assert!(args(&["--ranks", "8", "--sizes", "8,0"]).sizes().is_err());
}

#[test]
fn sizes_come_from_the_list_or_the_sweep() {
    assert_eq!(args(&["--ranks", "2", "--sizes", "8,1M,1G"]).sizes().unwrap(), [8, 1 << 20, 1 << 30]);
    let sweep = args(&["--ranks", "2"]).sizes().unwrap();
    assert_eq!((sweep.len(), sweep[0], sweep[sweep.len() - 1]), (15, 4, 1 << 30), "4 B to 1 GiB by 4");
    assert!(sweep.contains(&(1 << 20)), "1 MiB is a row");
    assert_eq!(args(&["--ranks", "2", "-b", "1K", "-e", "4K", "-f", "2"]).sizes().unwrap(), [1024, 2048, 4096]);
    assert!(Cli::try_parse_from(["plan", "--ranks", "2", "--sizes", "8", "-b", "16"]).is_err(), "one or the other");
}

#[test]
fn the_table_has_a_row_per_size_with_the_choice_its_bound_and_busbw() {
    let rates = args(&["--ranks", "8"]).rates(None, None).unwrap();
    let sizes = [8, 1 << 30];
    let plans: Vec<(usize, Plan)> = sizes.iter().map(|&b| (b, cost::choose_with(&rates.machine, b, None))).collect();
    let text = render(&rates, &plans, None);
    let (model, communicator) = text.split_once("One process per GPU").expect("the communicator's table");
    let (communicator, compressed) = communicator.split_once("Compressed all-reduce").expect("the compressed table");
    fn rows_of(part: &str) -> Vec<&str> {
        part.lines().filter(|l| l.starts_with(' ') && l.trim_start().starts_with(char::is_numeric)).collect()
    }
    let rows = rows_of(model);
    assert_eq!(rows.len(), 2, "{text}");
    // The communicator's: 8 B in lines (16 B moved, one handoff), 1 GiB past their 64 KiB, in
    // rounds (N phases) whose fill (an 8 MiB slot each way) leaves DRAM binding, and 8 rounds
    // of 16 chunks and the fill as steps of four operations: 8 × 11.4 µs + 22 × 2^30 / 140e9
    // s + 129 × 4 × 5.25 µs = 171531.1 µs.
    let theirs = rows_of(communicator);
    assert_eq!(theirs.len(), 2, "{text}");
    assert!(theirs[0].ends_with("one-shot (lines)") && theirs[0].contains("11.4  handoffs"), "{text}");
    assert!(theirs[1].contains("171531.1  dram") && theirs[1].ends_with("two-shot (rounds)"), "{text}");
    assert!(
        communicator.contains(
            "(8 handoffs, a share's chunk of fill each way, once for a shared link, four operations a chunk step)"
        ),
        "{text}"
    );
    // Compressed from the model's minimum on (8 H200s: 2 MiB, an exact 1 MiB taking the
    // flagged chunks), exact below it.
    let squeezed = rows_of(compressed);
    assert!(squeezed[0].ends_with("exact") && squeezed[1].ends_with("compressed"), "{text}");
    assert!(compressed.contains("GP2P_COMPRESS=int8|fp8[:BLOCK]") && compressed.contains("exact below 2M"), "{text}");
    assert!(rows[0].trim_start().starts_with("8 ") && rows[0].contains("one-shot  handoffs"), "{text}");
    // 1 GiB at N = 8 on the defaults: two-shot, DRAM binds at 22 × 2^30 / 140e9 + 22.8 µs
    // = 0.16875366 s, busbw 1.75 × 2^30 / that = 11.13 GB/s.
    assert!(rows[1].contains("two-shot  dram") && rows[1].ends_with("11.13"), "{text}");
    assert!(text.contains(
        "the model's defaults (measured on H200s; op-us fitted on an H100): h2d, d2h, duplex, host, dram, handoff-us, op-us"
    ));
    assert!(text.contains("GP2P_ALGORITHM=ring|one-shot|two-shot forces a choice"), "{text}");
    assert!(text.contains("not measurements"), "{text}");
    assert!(text.lines().all(|l| l == l.trim_end()), "trailing spaces: {text}");
    let forced: Vec<(usize, Plan)> =
        sizes.iter().map(|&b| (b, cost::choose_with(&rates.machine, b, Some(Algorithm::Ring)))).collect();
    let text = render(&rates, &forced, Some(Algorithm::Ring));
    assert!(text.contains("ring (forced)") && text.contains("GP2P_ALGORITHM=ring forces every choice"), "{text}");
    assert!(text.contains("GP2P_ALGORITHM=ring: the communicator refuses it"), "{text}");
    assert!(text.contains("never one-shot") && !text.contains("ring today"), "{text}");
}

#[test]
fn a_world_past_the_communicator_s_gets_no_communicator_table() {
    let rates = args(&["--ranks", "16"]).rates(None, None).unwrap();
    let plans: Vec<(usize, Plan)> =
        [1 << 20].iter().map(|&b| (b, cost::choose_with(&rates.machine, b, None))).collect();
    let text = render(&rates, &plans, None);
    assert!(text.contains("a communicator takes at most 8 ranks, so 16 run as groups"), "{text}");
    let header = ["size", "µs", "bound", "busbw", "GB/s", "runs"];
    let tables = text.lines().filter(|l| l.split_whitespace().eq(header)).count();
    assert_eq!(tables, 0, "no table for a world it refuses: {text}");
}

#[test]
fn two_ranks_get_the_communicator_s_paths_with_the_pipeline_s_fill() {
    let rates = args(&["--ranks", "2", "--uplink", "2", "--duplex", "50"]).rates(None, None).unwrap();
    let plans: Vec<(usize, Plan)> =
        [1 << 10, 4 << 20, 16 << 20].iter().map(|&b| (b, cost::choose_with(&rates.machine, b, None))).collect();
    let text = render(&rates, &plans, None);
    let (_, communicator) = text.split_once("One process per GPU").expect("the communicator's table");
    let rows: Vec<&str> = communicator.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).collect();
    assert!(rows[0].ends_with("one kernel (lines)") && rows[1].ends_with("one kernel (chunks)"), "{text}");
    // 16 MiB in chunks of 4 MiB, one of fill each way once for the link, both ranks on one
    // 50 GB/s link: (2 × 16 + 4) MiB / 50 GB/s + one 11.4 µs handoff + five steps of four
    // operations at 5.25 µs.
    assert!(rows[2].contains("871.4  uplink") && rows[2].ends_with("exchange"), "{text}");
}

#[test]
fn json_holds_the_machine_and_every_prediction() {
    let rates = args(&["--ranks", "4", "--host", "48"]).rates(None, None).unwrap();
    let plans = vec![(1 << 20, cost::choose_with(&rates.machine, 1 << 20, None))];
    let value = serde_json::to_value(json(&rates, &plans, None)).unwrap();
    assert_eq!(value["ranks"], 4);
    assert_eq!(value["machine"]["host_gbps"], 48.0);
    assert_eq!(value["machine"]["sources"]["host"], "flag");
    assert_eq!(value["machine"]["sources"]["h2d"], "default");
    assert_eq!(value["machine"]["sources"]["handoff-us"], "default");
    assert_eq!(value["forced"], serde_json::Value::Null);
    let row = &value["rows"][0];
    assert_eq!(row["bytes"], 1 << 20);
    assert_eq!(row["predictions"].as_array().unwrap().len(), 3);
    assert_eq!(row["predictions"][0]["phases"], 6);
    assert_eq!(row["chosen"], plans[0].1.chosen.name());
}

#[test]
fn ranks_sharing_a_gpu_price_their_turns_in_the_communicator_s_table() {
    // The communicator's time at 4 MiB among 8 (the rounds: above the flagged chunks) on one
    // 50 GB/s link, a card each or all on one GPU.
    let four_mib_us = |line: &[&str]| -> (f64, String) {
        let rates = args(line).rates(None, None).unwrap();
        let plans = vec![(4 << 20, cost::choose_with(&rates.machine, 4 << 20, None))];
        let text = render(&rates, &plans, None);
        let (_, communicator) = text.split_once("One process per GPU").expect("the communicator's table");
        let row = communicator.lines().find(|l| l.trim_start().starts_with(char::is_numeric)).expect("a row");
        (row.split_whitespace().nth(1).unwrap().parse().unwrap(), text)
    };
    let (apart, text) = four_mib_us(&["--ranks", "8", "--uplink", "8", "--duplex", "50"]);
    assert!(!text.contains("ranks share one"), "{text}");
    let (shared, text) = four_mib_us(&["--ranks", "8", "--uplink", "8", "--duplex", "50", "--ranks-per-gpu", "8"]);
    assert!(text.contains("GPU: 8 ranks share one"), "{text}");
    // Nine chunk steps (a share each of the eight rounds, and the fill), 7 × 6 turns each.
    let turns_us = 9.0 * 42.0 * cost::DEVICE_TURN_US;
    assert!((shared - apart - turns_us).abs() < 0.2, "{apart} µs apart, {shared} µs on one GPU");
    for bad in ["0", "9"] {
        let e = args(&["--ranks", "8", "--ranks-per-gpu", bad]).rates(None, None).err().expect("refused");
        assert!(e.to_string().contains("--ranks-per-gpu"), "{e}");
    }
}

#[test]
fn two_ranks_on_one_gpu_get_the_rounds_their_communicator_takes_there() {
    let rates = args(&["--ranks", "2", "--ranks-per-gpu", "2", "--duplex", "50"]).rates(None, None).unwrap();
    assert_eq!(rates.machine.cards_per_uplink, 2, "ranks on one GPU share its link");
    let plans: Vec<(usize, Plan)> =
        [1 << 20, 16 << 20].iter().map(|&b| (b, cost::choose_with(&rates.machine, b, None))).collect();
    let text = render(&rates, &plans, None);
    // The shared link's source is the flag that implied it, not "the default".
    assert!(text.contains("uplink: 2 cards share one PCIe uplink at most (--ranks-per-gpu"), "{text}");
    let (_, communicator) = text.split_once("One process per GPU").expect("the communicator's table");
    let rows: Vec<&str> = communicator.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).collect();
    assert!(rows[0].ends_with("one kernel (chunks)"), "{text}");
    assert!(rows[1].ends_with("two-shot (rounds)"), "{text}");
}
