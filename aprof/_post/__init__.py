"""Post-processing: consolidation, analysis, sessions."""
