"""One collector per data source; see ``base.Collector`` for the contract."""
