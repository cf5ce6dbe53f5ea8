"""Doctor: rules that find training-script pitfalls, each returning findings with evidence and a fix."""
