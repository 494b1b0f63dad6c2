"""What a run tells: progress lines, the end-of-run summary and out/build-report.json (reporter), and its
timeline in the Chrome trace format (trace).

May import: base, load, declare, store, share, compile, plan, ship, tune."""
