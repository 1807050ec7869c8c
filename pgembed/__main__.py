from pgembed.cli import main

main()
