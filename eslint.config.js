// `npm run lint`: ESLint with typescript-eslint (type-aware where it matters: promises); Prettier checks the layout.
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', 'bench/results/', 'coverage/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: globals.node,
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // A promise nobody awaits loses its error (in a server it may crash the process or answer twice).
      '@typescript-eslint/no-floating-promises': [
        'error',
        {
          // node:test's describe/it return promises the runner itself awaits.
          allowForKnownSafeCalls: [
            {
              from: 'package',
              package: 'node:test',
              name: ['describe', 'it', 'test', 'suite', 'before', 'after', 'beforeEach', 'afterEach'],
            },
          ],
        },
      ],
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      // `_name`: unused on purpose (Express's four-argument error handler, a field left out of a copy).
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', ignoreRestSiblings: true },
      ],
      // Platform answers and zod internals are typed at the boundary where they are checked; `any` there is deliberate.
      '@typescript-eslint/no-explicit-any': 'off',
    },
  },
  {
    // Loaded only where first needed (`await import()` in src/integrations/): a start without Gmail or
    // channels must not load them (test/e2e/lazy-integration-libraries.test.ts). Types are free.
    files: ['src/**/*.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        ...['@googleapis/gmail', 'google-auth-library', 'qrcode'].map((name) => ({
          name,
          allowTypeImports: true,
          message: `${name} is imported with await import() where it is first needed, never at the top of a module`,
        })),
      ],
    },
  },
  { files: ['**/*.js', '**/*.mjs'], ...tseslint.configs.disableTypeChecked },
  {
    // The web console's page scripts (served as they are, no build): the browser's globals, not Node's.
    files: ['console/**/*.js'],
    languageOptions: {
      sourceType: 'module',
      globals: {
        ...Object.fromEntries(Object.keys(globals.node).map((name) => [name, 'off'])),
        ...globals.browser,
      },
    },
  },
);
