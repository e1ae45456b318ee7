from pipeline.cli import cli

cli()
