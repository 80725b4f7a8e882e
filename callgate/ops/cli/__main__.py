from callgate.ops.cli.main import main

main()
