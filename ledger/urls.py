"""Buyer and provider money endpoints, mounted at /api/v1/ledger/."""

from django.urls import path

from ledger import api, web

urlpatterns = [
    path("chain/", api.ChainView.as_view(), name="ledger-chain"),
    path("escrow/", api.EscrowView.as_view(), name="ledger-escrow"),
    path("statement/", api.StatementView.as_view(), name="ledger-statement"),
    path("earnings/", api.EarningsView.as_view(), name="ledger-earnings"),
    path("trades/<int:trade_id>/", api.TradeLedgerView.as_view(), name="ledger-trade"),
    path("trades/<int:trade_id>/dispute/", api.DisputeView.as_view(), name="ledger-dispute"),
    path("trades/<int:trade_id>/ruling/", api.RulingView.as_view(), name="ledger-ruling"),
    path("deposit/", api.DepositView.as_view(), name="ledger-deposit"),
    path("withdraw/", api.WithdrawView.as_view(), name="ledger-withdraw"),
    path("faucet/", api.FaucetView.as_view(), name="ledger-faucet"),
]

# the ledger's pages of the web UI, in its "web" namespace (gridbid/urls.py joins them)
web_urlpatterns = [
    path("wallet/", web.wallet, name="wallet"),
    path("wallet/statement.csv", web.wallet_statement_csv, name="wallet-statement-csv"),
    path("trades/<int:trade_id>/", web.trade_page, name="trade"),
]
