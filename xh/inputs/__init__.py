"""Question and claim files in: `questions` (HotpotQA and batch scoring's question files, and HotpotQA
contexts -> a wiki dump) and `claims` (FEVER claim files, and the claim split), bad records quarantined
with the reason."""
