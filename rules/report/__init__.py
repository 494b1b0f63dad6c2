"""What a run tells (reporter): progress lines, the end-of-run summary, out/build-report.json, and its timeline in
the Chrome trace format.

May import: base, load, declare, store, share, compile, plan, ship, tune."""
