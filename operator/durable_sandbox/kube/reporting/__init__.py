"""What the operator says about its objects: status, conditions written from the journal, Events and its log."""
