"""The commands: one module per `mpslaunch` command, each with add_arguments(parser) and main(args)."""
