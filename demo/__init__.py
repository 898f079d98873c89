"""The living demo market of `gridbid up --demo`: demo buyers and providers, their bids,
heartbeats and jobs (demo.market), and their simulated agents on the dev chain, which
sign receipts and co-sign settlement (demo.chain). It sits on top of everything and may
import all of it; nothing but the runner and its tasks imports it."""
