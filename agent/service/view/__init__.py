"""The live view: annotated frames and the agent's figures in any browser (`view:` in the
config, `edge-agent run --view`), costing the frame path nothing while nobody watches."""
