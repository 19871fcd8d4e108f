int kvf_cmd_plan(int argc, char **argv);
int kvf_cmd_plan(int argc, char **argv) { (void)argc; (void)argv; return 0; }
