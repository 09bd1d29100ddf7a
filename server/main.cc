#include <cstdio>
int main() { std::puts("arbor"); return 0; }
