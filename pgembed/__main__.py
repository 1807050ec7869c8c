from pgembed.cli.main import main

main()
