from providers.agent.cli import main

main(prog_name="gridbid-agent")
